"""The breaker's services on real Postgres: the streak and hard-down, shedding under one marker
note per run, and restoring."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from agentops.exceptions import BadRequest, Conflict, NotFound
from agentops.models import Agent, Alert, AuditEntry, HistoryRow
from breaker.decision import BreakerAction
from breaker.models import BreakerState
from breaker.probes import breaker_probe_begin, breaker_probe_moved
from breaker.services import breaker_note_success, history_row_restore
from breaker.shedding import history_shed
from tests.breaker.common import SHED_REASON, end, fail, probe_out, row, state
from tests.factories import AgentFactory, HistoryRowFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("breaker_settings")]


# Streak and hard-down (§7.1)


def test_the_streak_counts_failures_and_hard_down_is_raised_at_the_threshold_and_on_every_failure_after(
    agent: Agent,
) -> None:
    steps = [fail(agent, "server", 500) for _ in range(5)]
    assert [s.streak for s in steps] == [1, 2, 3, 4, 5]
    assert [s.hard_down for s in steps] == [False, False, True, True, True]
    alerts = list(Alert.objects.filter(kind="hard-down", agent=agent.name).order_by("id"))
    assert len(alerts) == 3
    assert (
        "failed 3 turns in a row" in alerts[0].message and "server at HTTP 500" in alerts[0].message
    )
    assert "failed 5 turns in a row" in alerts[2].message
    assert alerts[0].model == agent.model


def test_below_the_threshold_the_breaker_does_nothing_even_for_a_sheddable_failure(
    agent: Agent,
) -> None:
    row(agent)
    assert fail(agent).action == BreakerAction.NOTHING
    assert fail(agent).action == BreakerAction.NOTHING
    assert fail(agent).action == BreakerAction.PROBE


def test_a_failure_that_may_not_shed_is_hard_down_with_nothing_to_do(agent: Agent) -> None:
    row(agent)
    for _ in range(2):
        fail(agent, "context_length", 400)
    step = fail(agent, "context_length", 400)
    assert step.hard_down and step.action == BreakerAction.NOTHING


def test_a_success_resets_the_streak_and_the_run_so_the_next_run_probes_again(agent: Agent) -> None:
    row(agent)
    row(agent)
    for _ in range(3):
        fail(agent)
    ticket = breaker_probe_begin(agent=agent)
    assert end(ticket, "answered").status == "answered"
    version = state(agent).streak_version
    breaker_note_success(agent=agent)
    s = state(agent)
    assert (s.streak, s.sheds_this_run, s.marker_row, s.probe_status) == (0, 0, None, "")
    assert s.streak_version == version + 1
    for _ in range(2):
        fail(agent)
    assert fail(agent).action == BreakerAction.PROBE
    assert Alert.objects.filter(kind="hard-down").count() == 2


def test_a_success_with_no_streak_leaves_the_streak_version_alone(agent: Agent) -> None:
    fail(agent)
    breaker_note_success(agent=agent)
    version = state(agent).streak_version
    breaker_note_success(agent=agent)
    assert state(agent).streak_version == version


def test_a_later_failure_withdraws_a_probe_still_out(agent: Agent) -> None:
    row(agent)
    for _ in range(3):
        fail(agent)
    ticket = breaker_probe_begin(agent=agent)
    fail(agent)
    assert state(agent).probe_status == "withdrawn"
    assert breaker_probe_moved(ticket=ticket) is not None
    assert end(ticket, "answered").status == "withdrawn"
    assert state(agent).probe_status == "withdrawn"


def test_a_disposed_agent_gets_no_probe(agent: Agent) -> None:
    row(agent)
    Agent.objects.filter(pk=agent.pk).update(disposed_at=timezone.now())
    agent.refresh_from_db()
    for _ in range(2):
        fail(agent)
    assert fail(agent).action == BreakerAction.NOTHING


# Shedding (§7.4)


def shed(agent: Agent) -> Any:
    return history_shed(agent=agent, reason=SHED_REASON)


def marker_rows(agent: Agent) -> list[HistoryRow]:
    notes = HistoryRow.objects.filter(agent=agent, role=HistoryRow.Role.SYSTEM_NOTE).order_by("seq")
    return [
        n for n in notes if isinstance(n.content, str) and n.content.startswith("[refusal-rewind]")
    ]


def test_a_shed_sets_aside_the_newest_row_and_writes_one_marker_that_never_quotes_it(
    agent: Agent,
) -> None:
    older = row(agent, content="older")
    newest = row(agent, content="secret poison text")
    result = shed(agent)
    assert [r.pk for r in result.rows] == [newest.pk]
    newest.refresh_from_db()
    older.refresh_from_db()
    assert (
        newest.state == "set_aside"
        and newest.set_aside_by == "breaker"
        and newest.set_aside_at is not None
    )
    assert newest.set_aside_reason == "invalid_request at HTTP 400"
    assert older.state == "presented"
    (marker,) = marker_rows(agent)
    assert marker.participant == "agentops" and marker.state == "presented"
    assert marker.content.startswith(
        "[refusal-rewind] The 1 most recent turn(s) were set aside because the model API kept "
        "refusing the requests that carried them"
    )
    assert "secret poison" not in marker.content
    assert state(agent).sheds_this_run == 1 and state(agent).marker_row_id == marker.pk


def test_a_tool_result_is_set_aside_with_the_tool_call_before_it(agent: Agent) -> None:
    user = row(agent, content="use the tool")
    call = row(
        agent,
        HistoryRow.Role.ASSISTANT,
        [{"type": "tool_call", "id": "c1", "name": "t", "arguments": {}}],
    )
    result = row(
        agent, HistoryRow.Role.TOOL, [{"type": "tool_result", "tool_call_id": "c1", "content": "x"}]
    )
    out = shed(agent)
    assert [r.pk for r in out.rows] == [result.pk, call.pk]
    assert set(
        HistoryRow.objects.filter(agent=agent, state="set_aside").values_list("pk", flat=True)
    ) == {result.pk, call.pk}
    user.refresh_from_db()
    assert user.state == "presented"


def test_system_notes_are_skipped_and_each_run_keeps_one_marker_updated_in_place(
    agent: Agent,
) -> None:
    first = row(agent, content="first")
    second = row(agent, content="second")
    row(agent, HistoryRow.Role.SYSTEM_NOTE, "[inference-failed] something", participant="agentops")
    out1 = shed(agent)
    out2 = shed(agent)
    assert [r.pk for r in out1.rows] == [second.pk]
    assert [r.pk for r in out2.rows] == [first.pk]
    (marker,) = marker_rows(agent)
    assert (
        out1.marker is not None
        and out2.marker is not None
        and out1.marker.pk == out2.marker.pk == marker.pk
    )
    assert marker.content.startswith("[refusal-rewind] The 2 most recent turn(s)")
    assert marker.edited_at is not None
    assert (
        HistoryRow.objects.filter(agent=agent, role="system-note", state="presented").count() == 2
    )


def test_a_new_run_after_a_success_writes_a_new_marker(agent: Agent) -> None:
    row(agent)
    row(agent)
    shed(agent)
    breaker_note_success(agent=agent)
    shed(agent)
    markers = marker_rows(agent)
    assert len(markers) == 2
    assert all(m.content.startswith("[refusal-rewind] The 1 most recent") for m in markers)


def test_at_the_cap_the_shed_stops_and_sets_nothing_aside(agent: Agent) -> None:
    for i in range(5):
        row(agent, content=f"m{i}")
    for _ in range(3):
        assert shed(agent).stopped is None
    before = HistoryRow.objects.filter(agent=agent, state="set_aside").count()
    out = shed(agent)
    assert out.stopped == "cap" and out.rows == [] and out.sheds_this_run == 3
    assert HistoryRow.objects.filter(agent=agent, state="set_aside").count() == before == 3


def test_with_nothing_left_the_shed_stops(agent: Agent) -> None:
    row(agent, HistoryRow.Role.SYSTEM_NOTE, "a note", participant="agentops")
    out = shed(agent)
    assert out.stopped == "empty" and out.rows == []
    assert marker_rows(agent) == []


def test_the_breaker_says_stop_at_the_cap_and_when_nothing_is_left(agent: Agent) -> None:
    for _ in range(3):
        fail(agent)
    assert fail(agent).action == BreakerAction.STOP_EMPTY
    assert (
        "Nothing presented is left"
        in Alert.objects.filter(kind="hard-down").order_by("-id")[0].message
    )
    BreakerState.objects.filter(agent=agent).update(sheds_this_run=3)
    row(agent)
    assert fail(agent).action == BreakerAction.STOP_CAP


def test_an_answered_probe_lets_later_failures_of_the_run_shed_without_another_probe(
    agent: Agent,
) -> None:
    ticket = probe_out(agent)
    assert end(ticket, "answered").shed is not None
    assert fail(agent).action == BreakerAction.SHED


# Restore


@pytest.fixture
def set_aside(agent: Agent) -> HistoryRow:
    r: HistoryRow = HistoryRowFactory.create(
        agent=agent,
        state=HistoryRow.State.SET_ASIDE,
        set_aside_at=timezone.now(),
        set_aside_by="breaker",
        set_aside_reason="invalid_request at HTTP 400",
    )
    return r


def test_restoring_puts_the_row_back_with_an_audit_entry(
    agent: Agent, set_aside: HistoryRow
) -> None:
    restored = history_row_restore(
        agent_name=agent.name, row_id=set_aside.pk, actor="api:ops", requester="alice\x07"
    )
    assert (
        restored.state == "presented"
        and restored.set_aside_at is None
        and restored.set_aside_reason == ""
    )
    set_aside.refresh_from_db()
    assert set_aside.state == "presented"
    entry = AuditEntry.objects.get(action="history.restore")
    assert entry.actor == "api:ops" and entry.target == f"agent:{agent.name}/history:{set_aside.pk}"
    assert entry.data["requester"] == "alice" and entry.data["set_aside_by"] == "breaker"


def test_restoring_an_unknown_agent_or_row_is_not_found(
    agent: Agent, set_aside: HistoryRow
) -> None:
    with pytest.raises(NotFound):
        history_row_restore(
            agent_name="nobody", row_id=set_aside.pk, actor="api:ops", requester=None
        )
    other: Agent = AgentFactory.create()
    with pytest.raises(NotFound) as exc:
        history_row_restore(
            agent_name=other.name, row_id=set_aside.pk, actor="api:ops", requester=None
        )
    assert exc.value.data["field"] == "row_id"
    assert not AuditEntry.objects.exists()


def test_restoring_a_presented_row_is_a_conflict(agent: Agent) -> None:
    presented: HistoryRow = HistoryRowFactory.create(agent=agent)
    with pytest.raises(Conflict):
        history_row_restore(
            agent_name=agent.name, row_id=presented.pk, actor="api:ops", requester=None
        )
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("requester", [1, ["a"], {"a": 1}, True])
def test_a_non_string_requester_is_a_bad_request_naming_it(
    agent: Agent, set_aside: HistoryRow, requester: Any
) -> None:
    with pytest.raises(BadRequest) as exc:
        history_row_restore(
            agent_name=agent.name, row_id=set_aside.pk, actor="api:ops", requester=requester
        )
    assert exc.value.data["field"] == "requester"
    set_aside.refresh_from_db()
    assert set_aside.state == "set_aside"
