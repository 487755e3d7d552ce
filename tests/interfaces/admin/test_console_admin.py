"""The operator console (architecture.md §9): agents with status, streak, holds and current turn;
turns with their calls inline, each with its timeline; audit entries nobody can add, change or
delete through the admin; release, restore and acknowledge each behind a permission of its own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from agentops.alerts import alert_raise
from agentops.models import Agent, AuditEntry, HistoryRow
from breaker.models import BreakerState
from inference.models import InferenceCall, Turn
from tests.factories import AgentFactory, CallFactory, HistoryRowFactory, TurnFactory
from tests.waits.conftest import insert_row
from waits.clock import clock_ms
from waits.journal import journal_forget_process_state
from waits.services import wait_record

pytestmark = pytest.mark.django_db

SENT = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)


def at(ms: float) -> datetime:
    return SENT + timedelta(milliseconds=ms)


def login(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def superuser() -> Client:
    return login(User.objects.create_superuser("root", password="x"))


def staff(username: str, *codenames: str) -> Client:
    user = User.objects.create_user(username, password="x", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    assert user.user_permissions.count() == len(codenames), "a codename in the test does not exist"
    return login(user)


def cut_call(turn: Turn) -> InferenceCall:
    return CallFactory.create(
        turn=turn,
        agent=turn.agent,
        model="m1",
        streamed=True,
        sent_at=SENT,
        headers_at=at(10),
        first_event_at=at(40),
        first_content_at=at(40),
        last_event_at=at(140),
        ended_at=at(650),
        model_events=3,
        keepalives=4,
        outcome="cut",
        bound="between_events",
        bound_deadline=at(640),
        cut_lateness_ms=3.0,
        marks={
            "events": [40, 90, 140],
            "keepalives": [300, 400, 500],
            "bounds": {
                "before_content_ms": 500,
                "between_events_ms": 500,
                "think_tokens_per_second": 87,
                "flat_minimum_ms": 2000,
                "absolute_ms": 2500,
            },
        },
    )


def row_of(html: str, name: str) -> str:
    (row,) = [r for r in html.split("<tr")[1:] if f">{name}</a>" in r]
    return row.split("</tr>")[0]


def test_the_agents_list_shows_status_streak_holds_and_the_current_turn() -> None:
    agent: Agent = AgentFactory.create(name="ada", model="m1")
    idle: Agent = AgentFactory.create(name="bob")
    turn = TurnFactory.create(agent=agent, status=Turn.Status.HELD)
    BreakerState.objects.create(agent=agent, streak=2)
    wait_record(
        agent=agent, model="m1", retry_after_ms=600_000, reason="429 slow down", now_ms=clock_ms()
    )

    page = superuser().get("/admin/agentops/agent/")
    assert page.status_code == 200
    html = page.content.decode()
    row = row_of(html, "ada")
    assert '<td class="field-status">held</td>' in row
    assert '<td class="field-failure_streak">2</td>' in row
    assert '<td class="field-holds">m1 until 20' in row
    assert f'<a href="/admin/inference/turn/{turn.pk}/change/">turn {turn.pk} (held)</a>' in row
    idle_row = row_of(html, "bob")
    assert (
        '<td class="field-status">idle</td>' in idle_row
        and '<td class="field-holds">-</td>' in idle_row
    )
    assert idle.pk


def agents_page_queries(client: Client, count: int) -> int:
    """Make agents up to ``count``, each with an open turn, a streak and a binding wait, and
    count the agents list's queries (from a cold journal, as each page load may find it)."""
    for _ in range(count - Agent.objects.count()):
        agent: Agent = AgentFactory.create(model="m1")
        TurnFactory.create(agent=agent, status=Turn.Status.QUEUED)
        TurnFactory.create(agent=agent, status=Turn.Status.HELD)
        BreakerState.objects.create(agent=agent, streak=1)
        wait_record(
            agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=clock_ms()
        )
    journal_forget_process_state()
    with CaptureQueriesContext(connection) as queries:
        page = client.get("/admin/agentops/agent/")
    assert page.status_code == 200
    assert page.content.decode().count('<td class="field-status">held</td>') == count
    return len(queries)


@pytest.mark.parametrize("journal", ["readable", "unreadable"])
def test_the_agents_list_reads_as_many_queries_for_20_agents_as_for_2(journal: str) -> None:
    client = superuser()
    if journal == "unreadable":
        insert_row(kind="pause")  # every agent is then held on "*" by the unreadable records
    assert agents_page_queries(client, 2) == agents_page_queries(client, 20)
    # An agent's own page reads the same things for its one agent.
    agent = Agent.objects.order_by("id").first()
    assert agent is not None
    page = client.get(f"/admin/agentops/agent/{agent.pk}/change/").content.decode()
    assert "held" in page and ("m1 until 20" if journal == "readable" else "* until") in page


def test_a_turns_page_shows_its_calls_inline_each_with_a_small_timeline() -> None:
    turn = TurnFactory.create(status=Turn.Status.FAILED)
    call = cut_call(turn)
    html = superuser().get(f"/admin/inference/turn/{turn.pk}/change/").content.decode()
    assert 'class="call-timeline small"' in html
    assert f"/admin/inference/inferencecall/{call.pk}/change/" in html
    assert html.count('class="event"') == 3 and html.count('class="cut"') == 1

    page = (
        superuser_again().get(f"/admin/inference/inferencecall/{call.pk}/change/").content.decode()
    )
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="call-timeline"' in page
    assert "cut at 643 ms, 3 ms after its deadline" in page
    assert "between-events deadline 640 ms (cut the call)" in page


def superuser_again() -> Client:
    return login(User.objects.get(username="root"))


@pytest.mark.parametrize("path", ["inference/turn", "inference/inferencecall"])
def test_turns_and_calls_are_read_only_even_for_a_superuser(path: str) -> None:
    turn = TurnFactory.create(status=Turn.Status.FAILED)
    call = cut_call(turn)
    pk = turn.pk if path == "inference/turn" else call.pk
    client = superuser()
    assert client.get(f"/admin/{path}/add/").status_code == 403
    assert client.post(f"/admin/{path}/{pk}/delete/", {"post": "yes"}).status_code == 403
    assert (
        client.post(
            f"/admin/{path}/{pk}/change/", {"status": "succeeded", "outcome": "completed"}
        ).status_code
        == 403
    )
    assert (
        Turn.objects.get(pk=turn.pk).status == "failed"
        and InferenceCall.objects.get(pk=call.pk).outcome == "cut"
    )


def test_nobody_adds_changes_or_deletes_an_audit_entry_through_the_admin_not_even_a_superuser() -> (
    None
):
    entry = AuditEntry.objects.create(
        actor="api:x", action="wait.release", target="ada/m1", reason="fixed"
    )
    client = superuser()
    listing = client.get("/admin/agentops/auditentry/")
    assert listing.status_code == 200 and b"wait.release" in listing.content
    assert (
        b"/admin/agentops/auditentry/add/" not in listing.content
        and b"delete_selected" not in listing.content
    )
    assert client.get("/admin/agentops/auditentry/add/").status_code == 403
    assert (
        client.post(
            "/admin/agentops/auditentry/add/", {"actor": "forged", "action": "x", "target": "y"}
        ).status_code
        == 403
    )
    view = client.get(f"/admin/agentops/auditentry/{entry.pk}/change/")
    assert view.status_code == 200 and b'name="_save"' not in view.content  # shown, not editable
    assert (
        client.post(
            f"/admin/agentops/auditentry/{entry.pk}/change/",
            {"actor": "forged", "reason": "forged"},
        ).status_code
        == 403
    )
    assert client.get(f"/admin/agentops/auditentry/{entry.pk}/delete/").status_code == 403
    assert (
        client.post(f"/admin/agentops/auditentry/{entry.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    client.post(
        "/admin/agentops/auditentry/",
        {"action": "delete_selected", "_selected_action": [entry.pk], "post": "yes"},
    )
    assert AuditEntry.objects.filter(pk=entry.pk, actor="api:x", reason="fixed").count() == 1
    assert AuditEntry.objects.count() == 1


VIEW = (
    "view_agent",
    "view_alert",
    "view_historyrow",
    "view_auditentry",
    "view_waitjournalentry",
    "view_turn",
    "view_inferencecall",
)
ACTIONS = {
    # permission: (page, what an operator sees only with it)
    "release_wait": ("/admin/waits/bindingwait/", "release-wait"),
    "restore_historyrow": ("/admin/agentops/historyrow/", "Restore the selected set-aside rows"),
    "acknowledge_alert": ("/admin/agentops/alert/", "Acknowledge the selected alerts"),
}


@pytest.mark.parametrize("missing", sorted(ACTIONS))
def test_each_action_needs_its_own_permission_and_the_others_do_not_grant_it(missing: str) -> None:
    agent = AgentFactory.create(name="ada", model="m1")
    wait_record(
        agent=agent, model="m1", retry_after_ms=600_000, reason="429 slow down", now_ms=clock_ms()
    )
    HistoryRowFactory.create(agent=agent, state=HistoryRow.State.SET_ASIDE, set_aside_by="breaker")
    alert_raise(kind="hard-down", agent="ada", message="down")
    others = [p for p in ACTIONS if p != missing]
    client = staff("op", *VIEW, *others)
    for permission, (page, action) in ACTIONS.items():
        response = client.get(page)
        assert response.status_code == 200, page
        assert (action in response.content.decode()) is (permission != missing), (permission, page)
    if missing == "release_wait":
        assert (
            client.get(
                "/admin/waits/bindingwait/release/", {"agent": "ada", "model": "m1"}
            ).status_code
            == 403
        )
