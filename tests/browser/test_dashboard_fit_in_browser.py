"""In a real headless Chromium at 1,366 and 1,920 px: the live dashboard's per-agent table shows
every column within its own panel, never under the Alerts panel beside it, with long names, an
agent on its alternate, a probe out, a spend with budgets that hold and a context bar (issue 54,
item 5: at 1,366 px the table ran under Alerts, hiding spend, budget and the held mark)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from agentops.alerts import alert_raise
from agentops.models import Project
from agentops.services import fallbacks_checked
from breaker.models import BreakerState
from tests.browser.test_spend_in_browser import spent
from tests.conftest import wait_for
from tests.factories import AgentFactory, ProviderFactory
from tests.interfaces.test_spend_pages import agent_and_held_project_budgets
from waits.clock import clock_ms
from waits.services import wait_record

from .test_release_in_browser import content, log_in

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.django_db(transaction=True)

# Each header and cell of the per-agent table against its panel and the Alerts panel: any that
# reaches past its panel's right edge, or under Alerts, is listed (none is hidden instead:
# the panel does not clip, so a cell past it would show under Alerts).
OUTSIDE_JS = """
const panel = document.querySelector('#breakers-panel').getBoundingClientRect();
const alerts = document.querySelector('.alerts-panel').getBoundingClientRect();
const cells = [...document.querySelectorAll('#breakers-panel th, #breakers-panel td')];
const out = cells.map(c => [c.textContent.trim().slice(0, 40), c.getBoundingClientRect()])
  .filter(([, r]) => r.width <= 0 || r.right > panel.right + 0.5 ||
          (alerts.width > 0 && r.right > alerts.left && r.left < alerts.right &&
           r.bottom > alerts.top && r.top < alerts.bottom))
  .map(([text, r]) => [text, Math.round(r.left), Math.round(r.right)]);
return [out, Math.round(panel.right), Math.round(alerts.left),
        document.documentElement.scrollWidth <= window.innerWidth];
"""


@pytest.fixture
def busy_agents() -> None:
    """Agents whose rows are as wide as rows get: long names and models, one on its alternate,
    one with its probe out and a streak, one spending against budgets that hold."""
    project = Project.objects.create(name="acme-production-agents")
    primary = ProviderFactory.create(name="acme-openai-primary-gateway")
    ProviderFactory.create(name="acme-anthropic-secondary")
    long_model = "claude-sonnet-4-5-20250929-extended-context"
    on_alternate = AgentFactory.create(
        name="acme-support-resident-agent-with-a-long-name",
        # Its own project: the other's held budget holds every target of that project's agents.
        project=Project.objects.create(name="acme-support"),
        provider=primary,
        model="gpt-5-mini-2025-08-07-long-deployment",
        context_window=200_000,
        fallbacks=fallbacks_checked(
            [{"provider": "acme-anthropic-secondary", "model": long_model}],
            model="gpt-5-mini-2025-08-07-long-deployment",
            provider=primary.name,
            max_tokens=256,
        ),
    )
    wait_record(
        agent=on_alternate,
        model=on_alternate.model,
        retry_after_ms=3_600_000,
        reason="429 rate limited by the gateway",
        now_ms=clock_ms(),
    )
    probed = AgentFactory.create(
        name="acme-billing-conversation-agent", project=project, model=long_model
    )
    BreakerState.objects.create(agent=probed, streak=5, sheds_this_run=2)
    spender = AgentFactory.create(
        name="acme-research-ephemeral-agent-42", project=project, model=long_model
    )
    for cost in ("12.345678", "0.000123", None):
        spent(spender, cost, model=long_model)
    spent(on_alternate, "3.5", model=long_model)
    agent_and_held_project_budgets(spender, project, timezone.now())
    alert_raise(
        kind="fallback-engaged",
        agent=on_alternate.name,
        model=on_alternate.model,
        message="word " * 80,
    )


@pytest.mark.parametrize("width", [1366, 1920])
def test_the_per_agent_table_fits_beside_the_alerts(
    browser: WebDriver, live_server: Any, busy_agents: None, width: int
) -> None:
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("wanda", password="a long operator password")
    browser.set_window_size(width, 768 if width == 1366 else 1080)
    log_in(browser, live_server.url, "wanda", "/dashboard/")
    wait_for(
        lambda: len(browser.find_elements(By.CSS_SELECTOR, "#breakers tr")) == 3,
        timeout=10,
        what="the per-agent table's rows",
    )
    out, panel_right, alerts_left, page_fits = browser.execute_script(OUTSIDE_JS)
    assert out == [], (width, panel_right, alerts_left, out)
    assert page_fits, width
    # Every column is there, with what it shows: the alternate, the spend, the held budget.
    titles = [content(th) for th in browser.find_elements(By.CSS_SELECTOR, "#breakers-panel th")]
    assert titles == [
        "agent",
        "model",
        "streak",
        "probe",
        "sheds",
        "set aside",
        "spent today",
        "context",
    ]
    rows = {
        content(r.find_element(By.CSS_SELECTOR, ".agent")): r
        for r in browser.find_elements(By.CSS_SELECTOR, "#breakers tr")
    }
    spender = rows["acme-research-ephemeral-agent-42"]
    assert "held" in content(spender.find_element(By.CSS_SELECTOR, "td.spend"))
    alternate = rows["acme-support-resident-agent-with-a-long-name"]
    assert "alternate" in content(alternate.find_elements(By.TAG_NAME, "td")[1])
