"""The admin: the journal is read-only; Binding waits lists holds; Release needs
``waits.release_wait`` and a reason, and goes through the one release service."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from agentops.models import Agent, AuditEntry
from waits.admission import admission_check
from waits.clock import clock_ms
from waits.models import WaitJournalEntry
from waits.services import wait_record

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.waits.urls")]

LIST = "/admin/waits/bindingwait/"
RELEASE = "/admin/waits/bindingwait/release/"


@pytest.fixture
def held_agent(agent: Agent) -> Agent:
    now = clock_ms()
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429 slow down", now_ms=now)
    wait_record(
        agent=agent, model="m2", retry_after_ms=math.nan, reason="429 until released", now_ms=now
    )
    return agent


def staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username=username, password="pw", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="waits", codename__in=codenames)
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def releaser(db: None) -> Client:
    return staff("grace", "view_waitjournalentry", "release_wait")


@pytest.fixture
def viewer(db: None) -> Client:
    return staff("linus", "view_waitjournalentry")


def test_a_staff_user_with_release_permission_sees_release_and_releases_with_a_reason(
    held_agent: Agent, releaser: Client
) -> None:
    page = releaser.get(LIST)
    assert page.status_code == 200
    html = page.content.decode()
    assert "429 slow down" in html and "until released" in html
    assert f"{RELEASE}?agent=ada&amp;model=m1" in html

    confirm = releaser.get(RELEASE, {"agent": "ada", "model": "m1"})
    assert confirm.status_code == 200
    assert 'name="reason"' in confirm.content.decode()

    done = releaser.post(RELEASE, {"agent": "ada", "model": "m1", "reason": "provider recovered"})
    assert done.status_code == 302 and done["Location"] == LIST
    entry = AuditEntry.objects.get(action="wait.release")
    assert (entry.actor, entry.reason, entry.target) == (
        "admin:grace",
        "provider recovered",
        "ada/m1",
    )
    assert entry.data["receipts"][0]["release"] == "recorded"
    assert admission_check(agent=held_agent, model="m1", now_ms=clock_ms()) is None
    assert admission_check(agent=held_agent, model="m2", now_ms=clock_ms()) is not None


def test_releasing_every_model_from_the_admin(held_agent: Agent, releaser: Client) -> None:
    done = releaser.post(RELEASE, {"agent": "ada", "model": "*", "reason": "all clear"})
    assert done.status_code == 302
    assert AuditEntry.objects.get().target == "ada/*"
    assert admission_check(agent=held_agent, model="m2", now_ms=clock_ms()) is None


@pytest.mark.parametrize(
    ("form", "error"),
    [
        ({"agent": "ada", "model": "m1", "reason": ""}, "reason: a reason is required"),
        ({"agent": "ada", "model": "m1", "reason": "   "}, "reason: a reason is required"),
        ({"agent": "ada", "model": "", "reason": "x"}, "model: must not be empty"),
        (
            {"agent": "ada", "model": ["m1", "m2"], "reason": "x"},
            "model: must be a string, not a list",
        ),
        (
            {"agent": "ada", "model": "m1\x07", "reason": "x"},
            "model: must not contain control characters",
        ),
        (
            {"agent": "ada\x00", "model": "m1", "reason": "x"},
            "agent: must not contain control characters",
        ),
        ({"agent": "nobody", "model": "m1", "reason": "x"}, "no agent named"),
    ],
)
def test_an_invalid_release_shows_an_error_on_the_confirmation_page_and_changes_nothing(
    held_agent: Agent, releaser: Client, form: dict[str, object], error: str
) -> None:
    rows = WaitJournalEntry.objects.count()
    response = releaser.post(RELEASE, form)
    assert response.status_code in (400, 404)
    assert error in response.content.decode()
    assert WaitJournalEntry.objects.count() == rows and not AuditEntry.objects.exists()


def test_a_staff_user_without_release_permission_sees_no_release_and_gets_403(
    held_agent: Agent, viewer: Client
) -> None:
    page = viewer.get(LIST)
    assert page.status_code == 200
    html = page.content.decode()
    assert "429 slow down" in html
    assert RELEASE not in html and "release-wait" not in html
    assert viewer.get(RELEASE, {"agent": "ada", "model": "m1"}).status_code == 403
    assert (
        viewer.post(RELEASE, {"agent": "ada", "model": "m1", "reason": "sneaky"}).status_code == 403
    )
    assert not AuditEntry.objects.exists()
    assert admission_check(agent=held_agent, model="m1", now_ms=clock_ms()) is not None


def test_a_staff_user_without_any_waits_permission_cannot_see_the_list(held_agent: Agent) -> None:
    assert staff("nobody").get(LIST).status_code == 403


def test_the_journal_is_read_only_even_for_a_superuser(held_agent: Agent) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser(username="root", password="pw"))
    assert client.get("/admin/waits/waitjournalentry/").status_code == 200
    entry = WaitJournalEntry.objects.first()
    assert entry is not None
    assert client.get("/admin/waits/waitjournalentry/add/").status_code == 403
    assert (
        client.post(
            f"/admin/waits/waitjournalentry/{entry.pk}/delete/", {"post": "yes"}
        ).status_code
        == 403
    )
    detail = client.post(f"/admin/waits/waitjournalentry/{entry.pk}/change/", {"kind": "release"})
    assert detail.status_code == 403
    assert WaitJournalEntry.objects.get(pk=entry.pk).kind == "set"


def test_the_journal_lists_each_waits_end_as_an_instant_not_an_epoch(held_agent: Agent) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser(username="root", password="pw"))
    entry = WaitJournalEntry.objects.get(agent=held_agent.name, model="m1")
    assert entry.until_ms is not None
    html = client.get("/admin/waits/waitjournalentry/").content.decode()
    assert (
        datetime.fromtimestamp(entry.until_ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        in html
    )
    assert str(entry.until_ms) not in html
