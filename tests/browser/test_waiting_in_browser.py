"""In a real headless Chromium: the live dashboard lists a turn whose next call waits for the
service's own pacing, with its reason and a countdown that moves (issue 13, "a turn says why
it waits")."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from inference.models import Turn
from tests.conftest import wait_for
from tests.factories import AgentFactory, TurnFactory

from .test_release_in_browser import content, log_in

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = pytest.mark.django_db(transaction=True)

COUNTDOWN = re.compile(r"^in (\d+) min(?: (\d+) s)?")


def test_the_dashboard_shows_a_turn_waiting_for_its_pacing_with_a_live_countdown(
    browser: WebDriver, live_server: Any
) -> None:
    from selenium.webdriver.common.by import By

    agent = AgentFactory.create(name="paced")
    # No worker runs here: the turn stays queued, its next call 90 s away (a 429's pacing).
    turn = TurnFactory.create(
        agent=agent,
        status=Turn.Status.QUEUED,
        not_before=timezone.now() + timedelta(seconds=90),
        waiting_reason="pacing after a 429",
    )
    User.objects.create_superuser("wanda", password="a long operator password")
    log_in(browser, live_server.url, "wanda", "/dashboard/")

    rows = wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, "#waiting tr"),
        timeout=10,
        what="the waiting turn's row",
    )
    cells = rows[0].find_elements(By.TAG_NAME, "td")
    assert [content(c) for c in (cells[0], cells[1], cells[3])] == [
        "paced",
        f"#{turn.pk}",
        "pacing after a 429",
    ]
    assert content(browser.find_element(By.ID, "waiting-count")) == "1"

    def left_s() -> int:
        match = COUNTDOWN.match(
            content(browser.find_element(By.CSS_SELECTOR, "#waiting td[data-until]"))
        )
        assert match is not None
        return int(match.group(1)) * 60 + int(match.group(2) or 0)

    first = left_s()
    assert 80 <= first <= 90, first
    time.sleep(
        2.2
    )  # no reload: two ticks of the page's own 1 s clock move it (the 1..4 s bound below)
    assert 1 <= first - left_s() <= 4
