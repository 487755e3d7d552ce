"""In a real headless Chromium: the live dashboard shows each agent's context bar, the last
call's input against the model's known window (architecture.md §5.9)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User

from inference.models import InferenceCall
from tests.conftest import wait_for
from tests.factories import AgentFactory

from .test_release_in_browser import content, log_in

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_dashboard_shows_each_agents_context_bar(browser: WebDriver, live_server: Any) -> None:
    from selenium.webdriver.common.by import By

    agent = AgentFactory.create(name="long-runner", context_window=16000)
    AgentFactory.create(name="newcomer")
    InferenceCall.objects.create(agent=agent, model="answer", streamed=True, input_tokens=13600)
    User.objects.create_superuser("wanda", password="a long operator password")
    log_in(browser, live_server.url, "wanda", "/dashboard/")
    rows = wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, "#breakers tr"),
        timeout=10,
        what="the agents' rows",
    )
    by_agent = {
        content(r.find_element(By.CSS_SELECTOR, ".agent")): r.find_elements(By.TAG_NAME, "td")[-1]
        for r in rows
    }
    bar = by_agent["long-runner"]
    assert content(bar) == "85% of 16000"
    fill = bar.find_element(By.CSS_SELECTOR, ".context.near .bar > span")
    assert fill.get_attribute("style") == "width: 85%;"
    assert content(by_agent["newcomer"]) == "—"
