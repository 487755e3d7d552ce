"""In a real headless Chromium: an operator sees a binding wait count down on the admin's
Binding waits page, with links to the agent and its held turn, and watches a receiving call's
deadline move on the live dashboard as its model events arrive (architecture.md §9, issue 13)."""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.conftest import wait_for
from tests.turns.test_turns import submit, wait_turn

from .asgi import asgi_server  # noqa: F401  (a fixture)
from .test_release_in_browser import HELD_MODEL, VIEW, content, log_in, operator

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("workers")]

COUNTDOWN = re.compile(r"^in (\d+) min(?: (\d+) s)?$")


def left_s(match: re.Match[str]) -> int:
    return int(match.group(1)) * 60 + int(match.group(2) or 0)


def test_binding_waits_count_down_live_and_link_the_agent_and_its_turn(
    browser: WebDriver, live_server: Any, api: Client, make_agent: Any
) -> None:
    from selenium.webdriver.common.by import By

    agent = make_agent(model=HELD_MODEL)
    turn_id = submit(api, agent.name, ("alice", "hello"))["id"]
    wait_turn(api, turn_id, {"held"}, timeout=15)
    operator("grace", *VIEW)
    log_in(browser, live_server.url, "grace", "/admin/waits/bindingwait/")

    cell = browser.find_element(By.CSS_SELECTOR, ".wait-countdown[data-until-ms]")
    first = COUNTDOWN.match(content(cell))
    assert first is not None, content(cell)
    assert int(first.group(1)) in (19, 20)  # a 20-minute wait, a few seconds old

    time.sleep(
        2.2
    )  # no reload: two ticks of the page's own 1 s script move it (the 1..4 s bound below)
    later = COUNTDOWN.match(content(cell))
    assert later is not None, content(cell)
    assert 1 <= left_s(first) - left_s(later) <= 4, (first.group(0), later.group(0))

    browser.find_element(By.CSS_SELECTOR, "a.wait-turn").click()
    wait_for(
        lambda: browser.current_url.endswith(f"/admin/inference/turn/{turn_id}/change/"),
        timeout=10,
        what="the turn's page",
    )
    browser.back()
    browser.find_element(By.CSS_SELECTOR, "a.wait-agent").click()
    wait_for(
        lambda: browser.current_url.endswith(f"/admin/agentops/agent/{agent.pk}/change/"),
        timeout=10,
        what="the agent's page",
    )


@pytest.mark.timeout(180)
def test_a_receiving_calls_deadline_moves_on_the_dashboard(
    browser: WebDriver,
    asgi_server: str,  # noqa: F811
    api: Client,
    make_agent: Any,
) -> None:
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("olga", password="a long operator password")
    log_in(browser, asgi_server, "olga", "/dashboard/")
    wait_for(
        lambda: browser.find_element(By.ID, "conn").text == "live",
        timeout=20,
        what="the dashboard's feed",
    )

    agent = make_agent(model="answer:chunks=40,interval_ms=250")  # about 10 s of content
    submit(api, agent.name, ("alice", "tell me a long story"))
    cell_css = "#calls td[data-call]"
    wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, cell_css),
        timeout=30,
        interval=0.1,
        what="the call on the dashboard",
    )

    def shown() -> tuple[str, float, str]:
        cell = browser.find_element(By.CSS_SELECTOR, cell_css)
        return (
            str(cell.get_attribute("data-bound")),
            float(cell.get_attribute("data-deadline") or 0),
            content(cell),
        )

    def receiving() -> Any:
        try:
            bound, deadline, text = shown()
        except Exception:  # the row is re-rendered under us
            return None
        return (deadline, text) if bound == "between_events" else None

    deadline, text = wait_for(
        receiving, timeout=20, interval=0.1, what="the call's deadline to move to between events"
    )
    assert "between events in" in text and re.search(r"\d+ model events?, \d+ keepalives?", text), (
        text
    )

    # It keeps moving as model events arrive: a later deadline (events come every 250 ms).
    def moved_on() -> Any:
        now = receiving()
        return now if now is not None and now[0] > deadline else None

    moved = wait_for(
        moved_on, timeout=6, interval=0.1, what="the call's deadline to move to a later instant"
    )
    assert moved[0] > deadline


def test_the_admin_lists_fit_a_1400_px_window(
    browser: WebDriver, live_server: Any, api: Client, make_agent: Any
) -> None:
    """No horizontal scroll on the lists an operator reads most, with long models and messages."""
    from agentops.alerts import alert_raise

    agent = make_agent(model=HELD_MODEL)
    turn_id = submit(api, agent.name, ("alice", "hello"))["id"]
    wait_turn(api, turn_id, {"held"}, timeout=15)
    alert_raise(kind="provider-wait", agent=agent.name, model=agent.model, message="word " * 200)
    User.objects.create_superuser("olga", password="a long operator password")
    browser.set_window_size(1400, 1000)
    log_in(browser, live_server.url, "olga", "/admin/")
    for path in (
        "/admin/agentops/agent/",
        "/admin/inference/turn/",
        "/admin/inference/inferencecall/",
        "/admin/agentops/alert/",
        "/admin/waits/bindingwait/",
        "/admin/waits/waitjournalentry/",
    ):
        browser.get(f"{live_server.url}{path}")
        wide = browser.execute_script(
            "const t = document.querySelector('#result_list'); "
            "const c = t && t.closest('.results');"
            "return [document.documentElement.scrollWidth, window.innerWidth, "
            "t ? t.scrollWidth : 0, c ? c.clientWidth : 0];"
        )
        page_width, window_width, table_width, box_width = wide
        assert page_width <= window_width, (path, wide)
        assert table_width <= box_width + 1, (path, wide)
        # Column titles wrap between words, never inside one ("ST AT US"): a title's text runs on
        # no more lines than it has words.
        broken = browser.execute_script(
            "return [...document.querySelectorAll('#result_list thead th')].map(th => {"
            "  const text = th.innerText.trim(); if (!text) return null;"
            "  const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT); "
            "const tops = new Set();"
            "  for (let node = walker.nextNode(); node; node = walker.nextNode()) { "
            "if (!node.textContent.trim()) continue;"
            "    const range = document.createRange(); range.selectNodeContents(node);"
            "    for (const r of range.getClientRects()) "
            "if (r.width > 0) tops.add(Math.round(r.top)); }"
            "  const lines = tops.size;"
            "  return lines > text.split(/\\s+/).length ? text : null; }).filter(Boolean);"
        )
        assert broken == [], (path, broken)


# Each word of a list's cells (up to WORD_MAX characters: longer tokens, an id or a URL, may
# break; a hyphen is a place to break) on one line: the rects of its characters share one top.
BROKEN_WORDS_JS = """
const WORD_MAX = arguments[0];
const broken = [];
for (const td of document.querySelectorAll('#result_list tbody td, #result_list tbody th')) {
  const walker = document.createTreeWalker(td, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (const m of node.textContent.matchAll(/[^\\s-]+/g)) {
      if (m[0].length > WORD_MAX) continue;
      const range = document.createRange();
      range.setStart(node, m.index); range.setEnd(node, m.index + m[0].length);
      const tops = new Set([...range.getClientRects()].filter(r => r.width > 0)
                                                      .map(r => Math.round(r.top)));
      if (tops.size > 1) broken.push(m[0]);
    }
  }
}
return broken;
"""


@pytest.mark.parametrize("width", [1366, 1920])
def test_admin_list_cells_never_break_inside_a_word(
    browser: WebDriver, live_server: Any, api: Client, make_agent: Any, width: int
) -> None:
    """No cell breaks inside a word ("acm e-held", "Resi dent", "provi der-wait" at 1366 px,
    issue 47, item 2): a cell wraps between words, and a list still fits the window."""
    from agentops.alerts import alert_raise
    from agentops.models import AuditEntry

    agent = make_agent(model=HELD_MODEL, name="acme-held-resident-agent")
    turn_id = submit(api, agent.name, ("alice", "hello"))["id"]
    wait_turn(api, turn_id, {"held"}, timeout=15)
    alert_raise(kind="provider-wait", agent=agent.name, model=agent.model, message="word " * 60)
    AuditEntry.objects.create(
        actor="admin:administrator",
        action="release",
        target=f"provider-wait {agent.name} {agent.model}",
        reason="the provider said so on the phone " * 5,
    )
    User.objects.create_superuser("olga", password="a long operator password")
    browser.set_window_size(width, 1000)
    log_in(browser, live_server.url, "olga", "/admin/")
    for path in (
        "/admin/agentops/agent/",
        "/admin/agentops/alert/",
        "/admin/waits/waitjournalentry/",
        "/admin/agentops/auditentry/",
        "/admin/inference/turn/",
        "/admin/inference/inferencecall/",
    ):
        browser.get(f"{live_server.url}{path}")
        listed = browser.execute_script(
            "return document.querySelector('#result_list') ? '' : "
            "document.title + ': ' + document.body.innerText.slice(0, 400);"
        )
        assert listed == "", (path, width, listed)  # each list has a row to look at
        broken = browser.execute_script(BROKEN_WORDS_JS, 24)
        assert broken == [], (path, width, broken)
        fits = browser.execute_script(
            "const t = document.querySelector('#result_list');"
            "return [t.scrollWidth, t.closest('.results').clientWidth];"
        )
        assert fits[0] <= fits[1] + 1, (path, width, fits)  # no column off to the side
        page_width, window_width = browser.execute_script(
            "return [document.documentElement.scrollWidth, window.innerWidth];"
        )
        assert page_width <= window_width, (path, width, page_width, window_width)


def test_the_turn_pages_calls_table_fits_within_the_page(
    browser: WebDriver, live_server: Any, api: Client, make_agent: Any
) -> None:
    """The turn page's inference calls (an inline table) show every column at 1366 px."""
    agent = make_agent(model="answer")
    turn_id = submit(api, agent.name, ("alice", "hello"))["id"]
    wait_turn(api, turn_id, {"succeeded"}, timeout=30)
    User.objects.create_superuser("olga", password="a long operator password")
    browser.set_window_size(1366, 1000)
    log_in(browser, live_server.url, "olga", f"/admin/inference/turn/{turn_id}/change/")
    sizes = browser.execute_script(
        "const t = document.querySelector('.inline-group table');"
        "const r = t.getBoundingClientRect();"
        "const box = t.closest('.inline-group').getBoundingClientRect();"
        "return [r.right, box.right, document.documentElement.scrollWidth, window.innerWidth];"
    )
    table_right, box_right, page_width, window_width = sizes
    assert table_right <= box_right + 1 and page_width <= window_width, sizes
