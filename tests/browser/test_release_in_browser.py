"""In a real headless Chromium, against the live service: an operator logs in through the admin
login page, opens the binding waits, releases one with a reason, and sees the held turn resume
(a real Celery worker runs it against the stand-in) and the audit entry; a staff user without
the release permission sees no Release action (architecture.md §9, issue 6)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from agentops.models import AuditEntry
from inference.models import Turn
from tests.conftest import wait_for
from tests.turns.test_turns import submit, wait_turn

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("workers")]

VIEW = ("view_agent", "view_turn", "view_inferencecall", "view_auditentry", "view_waitjournalentry")
HELD_MODEL = "error:status=429,form=retry-after,wait_ms=1200000,times=1"  # 20 minutes, then answers


def operator(username: str, *codenames: str) -> User:
    user = User.objects.create_user(username, password="a long operator password", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return user


def log_in(browser: WebDriver, base: str, username: str, then: str) -> None:
    from selenium.webdriver.common.by import By

    browser.delete_all_cookies()
    browser.get(f"{base}/admin/login/?next={then}")
    browser.find_element(By.ID, "id_username").send_keys(username)
    browser.find_element(By.ID, "id_password").send_keys("a long operator password")
    browser.find_element(By.CSS_SELECTOR, "#login-form input[type=submit]").click()
    # Landed, and the landing page loaded whole: a get started while the login's redirect is
    # still loading can be overtaken by it (a list page once showed the admin index).
    wait_for(
        lambda: (
            browser.current_url.endswith(then)
            and browser.execute_script(
                "return document.readyState === 'complete' && !document.getElementById('login-form')"
            )
        ),
        timeout=10,
        what=f"{username} to land on {then}",
    )


def text(browser: WebDriver) -> str:
    """The page's visible text ("" while a navigation replaces the page under us)."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    try:
        return str(browser.find_element(By.TAG_NAME, "body").text)
    except (StaleElementReferenceException, NoSuchElementException):
        return ""


def content(element: WebElement) -> str:
    """An element's text as the page has it, not as the layout wraps it."""
    return " ".join(str(element.get_attribute("textContent") or "").split())


def listed_row(browser: WebDriver, agent: str) -> WebElement:
    """The Binding waits row of ``agent``: exactly one, on the page as first loaded (the page
    reads the journal rows the worker appended before its turn said ``held``)."""
    from selenium.webdriver.common.by import By

    # The login's redirect changes the URL before the list is on the page (seen under load).
    wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr"),
        timeout=10,
        what="the Binding waits list",
    )
    listed = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    matching = [r for r in listed if content(r.find_elements(By.TAG_NAME, "td")[0]) == agent]
    assert len(matching) == 1, [content(r) for r in listed]
    return matching[0]


def test_an_operator_releases_a_binding_wait_in_the_browser_and_the_turn_resumes(
    browser: WebDriver, live_server: Any, api: Client, make_agent: Any
) -> None:
    from selenium.webdriver.common.by import By

    agent = make_agent(model=HELD_MODEL)
    turn_id = submit(api, agent.name, ("alice", "hello"))["id"]
    wait_turn(api, turn_id, {"held"}, timeout=15)
    operator("grace", *VIEW, "release_wait")
    base = live_server.url

    log_in(browser, base, "grace", "/admin/waits/bindingwait/")
    # The admin's own stylesheet loaded (the header is styled, not the browser's default).
    header = browser.find_element(By.ID, "header")
    assert header.value_of_css_property("background-color") not in (
        "rgba(0, 0, 0, 0)",
        "transparent",
    )
    row = listed_row(browser, agent.name)
    assert HELD_MODEL in content(row) and "429" in content(row)

    row.find_element(By.CSS_SELECTOR, "a.release-wait").click()
    wait_for(
        lambda: "Release a provider wait" in browser.title, timeout=10, what="the confirmation page"
    )
    assert agent.name in text(browser)
    browser.find_element(By.ID, "id_reason").send_keys("provider fixed the quota")
    browser.find_element(By.CSS_SELECTOR, "#content-main input[type=submit][value=Release]").click()
    wait_for(
        lambda: f"Released {agent.name}" in text(browser),
        timeout=10,
        what="the release to be confirmed",
    )
    assert browser.current_url == f"{base}/admin/waits/bindingwait/"
    assert agent.name not in content(
        browser.find_element(By.ID, "result_list")
    )  # it no longer binds

    # The held turn resumes on the worker and succeeds; the turn's admin page shows it.
    def turn_page_says_succeeded() -> bool:
        from selenium.common.exceptions import StaleElementReferenceException

        browser.get(f"{base}/admin/inference/turn/{turn_id}/change/")
        try:
            shown = [
                e.text.lower()
                for e in browser.find_elements(By.CSS_SELECTOR, ".field-status .readonly")
            ]
        except StaleElementReferenceException:  # the page was still being replaced
            return False
        return shown == ["succeeded"]

    wait_for(
        turn_page_says_succeeded,
        timeout=20,
        interval=0.5,
        what="the turn page to show the turn succeeded",
    )
    assert Turn.objects.get(pk=turn_id).status == Turn.Status.SUCCEEDED
    calls = browser.find_elements(By.CSS_SELECTOR, "svg.call-timeline.small")
    assert len(calls) == 2  # the 429 that held it, and the call after the release

    browser.get(f"{base}/admin/agentops/auditentry/")
    (entry,) = [
        content(r)
        for r in browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
        if "wait.release" in content(r)
    ]
    assert "admin:grace" in entry and "provider fixed the quota" in entry
    assert AuditEntry.objects.filter(action="wait.release", actor="admin:grace").count() == 1


def test_a_staff_user_without_the_release_permission_sees_no_release_action_in_the_browser(
    browser: WebDriver, live_server: Any, api: Client, make_agent: Any
) -> None:
    from selenium.webdriver.common.by import By

    agent = make_agent(model=HELD_MODEL)
    turn_id = submit(api, agent.name, ("alice", "hello"))["id"]
    wait_turn(api, turn_id, {"held"}, timeout=15)
    operator("linus", *VIEW)
    base = live_server.url

    log_in(browser, base, "linus", "/admin/waits/bindingwait/")
    row = listed_row(browser, agent.name)
    assert HELD_MODEL in content(row)
    assert browser.find_elements(By.CSS_SELECTOR, "a.release-wait") == []
    assert "Release" not in content(browser.find_element(By.ID, "result_list"))
    browser.get(f"{base}/admin/waits/bindingwait/release/?agent={agent.name}&model=answer")
    assert "403" in browser.title or "Forbidden" in text(browser)
    assert not AuditEntry.objects.exists()
    assert Turn.objects.get(pk=turn_id).status == Turn.Status.HELD
