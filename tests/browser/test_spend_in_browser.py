"""In a real headless Chromium at 1,366 px: the admin's spend page of a project fits the window
(its chart, its tables), over 30 days and over 366; the live dashboard shows today's spend in
total and per agent, unpriced as unpriced, with a budget that holds (issue 48)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agentops.models import Project
from tests.conftest import wait_for
from tests.factories import AgentFactory, CallFactory
from tests.interfaces.test_spend_pages import agent_and_held_project_budgets, set_budget

from .test_release_in_browser import content, log_in

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.django_db(transaction=True)

FITS_JS = """
const page = document.documentElement.scrollWidth <= window.innerWidth;
const box = document.querySelector('#content').getBoundingClientRect();
const out = [...document.querySelectorAll('.spend-chart, table.spend')]
  .map(e => [e.id || e.className.baseVal || e.className, e.getBoundingClientRect()])
  .filter(([, r]) => r.left < box.left - 1 || r.right > box.right + 1)
  .map(([name, r]) => [String(name), r.left, r.right]);
return [page, document.documentElement.scrollWidth, window.innerWidth, out];
"""


def spent(agent: Any, cost: str | None, *, days_ago: int = 0, model: str = "answer") -> None:
    at = timezone.now() - timedelta(days=days_ago)
    CallFactory.create(
        agent=agent,
        model=model,
        outcome="completed",
        sent_at=at,
        ended_at=at,
        cost=None if cost is None else Decimal(cost),
        cost_basis="unpriced" if cost is None else "priced",
        input_tokens=123456,
        output_tokens=7890,
    )


def test_the_spend_page_fits_1366_px_and_shows_each_day(
    browser: WebDriver, live_server: Any
) -> None:
    from selenium.webdriver.common.by import By

    project = Project.objects.create(name="acme-production-agents")
    agent = AgentFactory.create(
        name="acme-support-resident-agent-with-a-long-name", project=project
    )
    for n in range(0, 40, 3):
        spent(agent, f"{n * 1.37:.6f}", days_ago=n, model="claude-sonnet-4-5-20250929-very-long")
    spent(agent, None, days_ago=1)
    set_budget(project, "25", "month", now=timezone.now())
    User.objects.create_superuser("olga", password="a long operator password")
    browser.set_window_size(1366, 1000)
    url = f"/admin/agentops/project/{project.pk}/spend/"
    log_in(browser, live_server.url, "olga", url)
    for days in (30, 366, 7):
        browser.get(f"{live_server.url}{url}?days={days}")
        bars = browser.find_elements(By.CSS_SELECTOR, ".spend-chart g.day")
        assert len(bars) == days
        page, width, window, out = browser.execute_script(FITS_JS)
        assert page and out == [], (days, width, window, out)
        chart = browser.find_element(By.CSS_SELECTOR, ".spend-chart").rect
        assert chart["height"] > 100, chart  # scaled to the width, still readable
    rows = browser.find_elements(By.CSS_SELECTOR, "#spend-days tbody tr")
    assert [content(r.find_elements(By.TAG_NAME, "td")[1]) for r in rows[:3]] == [
        "0",
        "unpriced (1 call)",
        "no calls",
    ]
    # From the project's page, its Spend button leads here.
    browser.get(f"{live_server.url}/admin/agentops/project/{project.pk}/change/")
    browser.find_element(By.CSS_SELECTOR, "a.project-spend").click()
    wait_for(lambda: browser.current_url.endswith(url), timeout=10, what="the project's spend page")


def test_the_dashboard_shows_todays_spend_and_budgets(browser: WebDriver, live_server: Any) -> None:
    from selenium.webdriver.common.by import By

    project = Project.objects.create(name="acme")
    ada = AgentFactory.create(name="ada", project=project)
    bob = AgentFactory.create(name="bob", project=project)
    spent(ada, "0.25")
    spent(ada, "0.5")
    spent(ada, None)
    spent(bob, None)
    now = timezone.now()
    agent_and_held_project_budgets(ada, project, now)
    User.objects.create_superuser("wanda", password="a long operator password")
    browser.set_window_size(1366, 1000)
    log_in(browser, live_server.url, "wanda", "/dashboard/")
    total = wait_for(
        lambda: browser.find_elements(By.ID, "spend-today"), timeout=10, what="today's spend"
    )[0]
    assert content(total) == "· 0.75 USD spent today (+2 unpriced calls)"
    rows = browser.find_elements(By.CSS_SELECTOR, "#breakers tr")
    cells = {
        content(r.find_element(By.CSS_SELECTOR, ".agent")): r.find_element(
            By.CSS_SELECTOR, "td.spend"
        )
        for r in rows
    }
    assert content(cells["ada"]) == "0.75 +1 unpriced0.75 / 2 per dayproject 10 / 10 per monthheld"
    assert content(cells["bob"]) == "unpricedproject 10 / 10 per monthheld"
    assert browser.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth"
    )
