"""The README's screenshots, taken in headless Chromium from the live service with real data.

Run it explicitly (it is not part of the test suite), with the project's environment:

    make screenshots
    # or, with your own PostgreSQL and Redis:
    DATABASE_URL=postgres://... REDIS_URL=redis://... .venv/bin/python -m pytest docs/screenshots.py -q

Each shot is a pytest test: it makes the data it shows (a real Celery worker runs turns against
the stand-in provider), logs in to the admin of a live server and saves a PNG under docs/. It
reuses the test suite's fixtures (workers, the stand-in, the browser).

To add a shot: a test that builds its data, then ``shoot(browser, base, path, "name.png")``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from inference.models import InferenceCall
from tests.conftest import WorkerPool, celery_app, wait_for
from tests.inference.test_turns import submit, wait_turn

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytest_plugins = ["tests.conftest", "tests.browser.conftest"]
pytestmark = [pytest.mark.django_db(transaction=True)]

DOCS = Path(__file__).resolve().parent
# Bounds in hundreds of milliseconds, so a cut happens in the time a screenshot takes.
BOUNDS = {
    "progress_bounds": {"before_content_ms": 800, "between_events_ms": 600, "think_tokens_per_second": 87},
    "flat_minimum_ms": 2000,
    "absolute_ms": 2500,
}


@pytest.fixture(scope="module")
def shots_pool(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    pool = WorkerPool(1, label="shots", extra_env={"AGENTOPS_INFERENCE_BOUNDS": json.dumps(BOUNDS)})
    yield pool
    pool.stop()


@pytest.fixture
def bounded(shots_pool: WorkerPool) -> WorkerPool:
    celery_app.conf.task_default_queue = shots_pool.queue
    return shots_pool


def log_in_as_admin(browser: WebDriver, base: str) -> None:
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("operator", password="screenshots only")
    browser.get(f"{base}/admin/login/?next=/admin/")
    browser.find_element(By.ID, "id_username").send_keys("operator")
    browser.find_element(By.ID, "id_password").send_keys("screenshots only")
    browser.find_element(By.CSS_SELECTOR, "#login-form input[type=submit]").click()
    wait_for(lambda: browser.current_url.endswith("/admin/"), timeout=10, what="the login")


def shoot(browser: WebDriver, base: str, path: str, name: str, *, width: int = 1280, height: int = 860) -> Path:
    browser.set_window_size(width, height)
    browser.get(f"{base}{path}")
    out = DOCS / name
    assert browser.save_screenshot(str(out)), f"could not save {out}"
    return out


def test_timeline_png(bounded: WorkerPool, browser: WebDriver, live_server: Any, api: Client, make_agent: Any) -> None:
    """docs/timeline.png: a call cut by the between-events bound, its model events, the pings
    that did not keep it alive, its deadlines as they stood, and the cut with its lateness."""
    agent = make_agent(provider="anthropic", model="silent-after-content:after_chunks=6,interval_ms=70,pings_ms=150", name="ada")
    turn = wait_turn(api, submit(api, agent.name, ("alice", "Summarise the incident report"))["id"])
    call = InferenceCall.objects.filter(turn_id=turn["id"]).order_by("id").first()
    assert call is not None and call.outcome == "cut", turn
    log_in_as_admin(browser, live_server.url)
    out = shoot(browser, live_server.url, f"/admin/inference/inferencecall/{call.pk}/change/", "timeline.png")
    print(f"saved {out}")


# --- docs/dashboard.png -------------------------------------------------------------------
# The live dashboard page (/dashboard/) is built separately. When it is merged, make it show
# something (an in-flight call, a hold) and drop the skip: the shot itself is ready.
DASHBOARD_PATH = "/dashboard/"


def test_dashboard_png(workers: WorkerPool, browser: WebDriver, live_server: Any, api: Client, make_agent: Any) -> None:
    """docs/dashboard.png: the live dashboard with a held turn's countdown (TODO: in-flight calls)."""
    log_in_as_admin(browser, live_server.url)
    if Client().get(DASHBOARD_PATH).status_code == 404:
        pytest.skip(f"{DASHBOARD_PATH} does not exist yet (the dashboard is another branch)")
    agent = make_agent(model="error:status=429,form=retry-after,wait_ms=1200000,times=1", name="ada")
    wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"], {"held"}, timeout=15)
    out = shoot(browser, live_server.url, DASHBOARD_PATH, "dashboard.png")
    print(f"saved {out}")
