"""The screenshots under docs/ (the README's, docs/operations.md's), taken in headless Chromium
from the live service with real data.

Run it explicitly (it is not part of the test suite), with the project's environment:

    make screenshots
    # or, with your own PostgreSQL and Redis:
    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python -m pytest docs/screenshots.py -q

Each shot is a pytest test: it makes the data it shows (real Celery workers run turns against
the stand-in provider), logs in to the admin of a live server and saves a PNG under docs/. It
reuses the test suite's fixtures (workers, the stand-in, the browser). The dashboard's shot
needs its websocket, so it serves the ASGI app with uvicorn (``asgi_server``) rather than
pytest-django's WSGI ``live_server``.

To add a shot: a test that builds its data, then ``shoot(browser, base, path, "name.png")``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from inference.models import InferenceCall
from tests.agentops import live_asgi
from tests.conftest import (
    WorkerPool,
    wait_for,
    worker_pool,
)
from tests.turns.test_turns import submit, wait_turn

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytest_plugins = ["tests.conftest", "tests.browser.conftest"]
pytestmark = [pytest.mark.django_db(transaction=True)]

DOCS = Path(__file__).resolve().parent
# Bounds in hundreds of milliseconds, so a cut happens in the time a screenshot takes.
BOUNDS = {
    "progress_bounds": {
        "before_content_ms": 800,
        "between_events_ms": 600,
        "think_tokens_per_second": 87,
    },
    "flat_minimum_ms": 2000,
    "absolute_ms": 2500,
}


@pytest.fixture(scope="module")
def shots_pool(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(
        1, label="shots", extra_env={"AGENTOPS_INFERENCE_BOUNDS": json.dumps(BOUNDS)}
    )


@pytest.fixture
def bounded(shots_pool: WorkerPool) -> WorkerPool:
    return shots_pool.routed()


def log_in_as_admin(browser: WebDriver, base: str) -> None:
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("operator", password="screenshots only")
    browser.get(f"{base}/admin/login/?next=/admin/")
    browser.find_element(By.ID, "id_username").send_keys("operator")
    browser.find_element(By.ID, "id_password").send_keys("screenshots only")
    browser.find_element(By.CSS_SELECTOR, "#login-form input[type=submit]").click()
    wait_for(lambda: browser.current_url.endswith("/admin/"), timeout=10, what="the login")


def shoot(
    browser: WebDriver, base: str, path: str, name: str, *, width: int = 1280, height: int = 860
) -> Path:
    browser.set_window_size(width, height)
    browser.get(f"{base}{path}")
    out = DOCS / name
    assert browser.save_screenshot(str(out)), f"could not save {out}"
    return out


def test_timeline_png(
    bounded: WorkerPool, browser: WebDriver, live_server: Any, api: Client, make_agent: Any
) -> None:
    """docs/timeline.png: a call cut by the between-events bound, its model events, the pings
    that did not keep it alive, its deadlines as they stood, and the cut with its lateness."""
    agent = make_agent(
        provider="anthropic",
        model="silent-after-content:after_chunks=6,interval_ms=70,pings_ms=150",
        name="ada",
    )
    turn = wait_turn(api, submit(api, agent.name, ("alice", "Summarise the incident report"))["id"])
    call = InferenceCall.objects.filter(turn_id=turn["id"]).order_by("id").first()
    assert call is not None and call.outcome == "cut", turn
    log_in_as_admin(browser, live_server.url)
    out = shoot(
        browser,
        live_server.url,
        f"/admin/inference/inferencecall/{call.pk}/change/",
        "timeline.png",
    )
    print(f"saved {out}")


# --- docs/dashboard.png -------------------------------------------------------------------
# The dashboard follows its websocket, which pytest-django's live server (WSGI) cannot serve:
# the shot runs the ASGI app under uvicorn, as `make run` does, on the test database.
DASHBOARD_PATH = "/dashboard/"


@pytest.fixture
def asgi_server(transactional_db: None) -> Iterator[str]:
    """uvicorn serving ``interfaces.asgi:application`` on the test database and this Redis, in
    its own process. Yields its base URL."""
    yield from live_asgi.asgi_server("shots")


@pytest.mark.timeout(240)
def test_dashboard_png(
    workers: WorkerPool, browser: WebDriver, asgi_server: str, providers: dict[str, Any]
) -> None:
    """docs/dashboard.png: the live dashboard as an operator sees it while `dashboard_demo`
    runs, a minute in: a stalled stream just cut at its before-content deadline and its fresh
    call counting down, a long answer counting down to its absolute deadline, a 2-hour hold and its
    alert, an agent hard down on its breaker with its probe refused, and the alerts."""
    from selenium.webdriver.common.by import By

    # The demo's agents use the stand-in providers by the names `providers` gives them.
    call_command("dashboard_demo", stdout=io.StringIO())
    log_in_as_admin(browser, asgi_server)
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False},
    )
    browser.get(f"{asgi_server}{DASHBOARD_PATH}")

    def shown() -> bool:
        from selenium.common.exceptions import StaleElementReferenceException

        try:
            return _shown()
        except StaleElementReferenceException:  # live progress re-renders the calls under us
            return False

    def _shown() -> bool:
        conn = browser.find_element(By.ID, "conn").text
        calling = {
            e.text for e in browser.find_elements(By.CSS_SELECTOR, "#calls tr:not(.gone) .agent")
        }
        holds = len(browser.find_elements(By.CSS_SELECTOR, "#holds tr:not(.gone)"))
        cut = browser.find_elements(By.CSS_SELECTOR, "#calls tr.gone .outcome-cut")
        down = browser.find_elements(By.CSS_SELECTOR, "#breakers .streak.down")
        alerts = browser.find_elements(By.CSS_SELECTOR, "#alerts li")
        return (
            conn == "live"
            and {"live-writer", "live-stalled"} <= calling
            and holds >= 1
            and bool(cut and down and alerts)
        )

    # The stalled stream is cut at its before-content deadline, 60 s after it is sent; its
    # fresh call starts a second later.
    wait_for(
        shown,
        timeout=120,
        interval=0.25,
        what="the dashboard to show the cut, the calls, the hold, the breaker and alerts",
    )
    # New rows and alerts flash yellow for a few seconds (the cut row stays 8 s): shoot once
    # the flashes are over, the cut row still there.
    flashing = "return document.getAnimations().filter((a) => a.animationName).length"
    wait_for(
        lambda: browser.execute_script(flashing) == 0,
        timeout=6,
        interval=0.1,
        what="the new rows to stop flashing",
    )
    assert browser.find_elements(By.CSS_SELECTOR, "#calls tr.gone .outcome-cut"), (
        "the cut row left before the shot"
    )
    assert browser.find_element(By.ID, "conn").text == "live"
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": 1400, "height": max(900, height), "deviceScaleFactor": 1, "mobile": False},
    )
    out = DOCS / "dashboard.png"
    assert browser.save_screenshot(str(out)), f"could not save {out}"
    print(f"saved {out}")


# --- docs/spend-all-projects.png ------------------------------------------------------------


def test_spend_all_projects_png(browser: WebDriver, live_server: Any) -> None:
    """docs/spend-all-projects.png at 1,366 px: a month of calls over six projects, and their
    budgets as bars, one held and one with calls in flight."""
    from tests.browser.test_spend_all_in_browser import budgets_of, month_of_spend

    budgets_of(month_of_spend(calls=3000, projects=6, agents=3))
    log_in_as_admin(browser, live_server.url)
    out = shoot(
        browser,
        live_server.url,
        "/admin/agentops/project/spend/",
        "spend-all-projects.png",
        width=1366,
        height=1000,
    )
    print(f"saved {out}")
