"""The hand-written statements (``agentops.rows``) read and write rows exactly as the ORM does."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import models

from agentops import rows
from agentops.models import Agent, HistoryRow
from agentops.services import history_append
from inference.models import Turn
from tests.factories import AgentFactory, TurnFactory

pytestmark = pytest.mark.django_db


def _values(obj: models.Model) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def test_a_row_inserted_by_hand_reads_back_through_the_orm_field_for_field() -> None:
    agent = AgentFactory.create()
    turn = Turn(
        agent=agent,
        status=Turn.Status.REQUIRES_ACTION,
        pending_tool_calls=[{"id": "c1", "name": "look", "arguments": {"q": "ü\u2028"}}],
        output={"content": "hi", "stop_reason": "tool_use", "tool_calls": []},
        error=None,
        hold_reason="x" * 600,
        not_before=datetime(2026, 12, 1, 12, 0, 0, 123456, tzinfo=UTC),
    )
    rows.insert(turn)
    assert turn.pk is not None and not turn._state.adding
    assert _values(Turn.objects.get(pk=turn.pk)) == _values(turn)


def test_a_row_read_by_hand_equals_the_orm_s_instance() -> None:
    agent = AgentFactory.create(
        tools=[{"name": "look", "parameters": {"type": "object"}}], system="be brief"
    )
    turn = TurnFactory.create(
        agent=agent,
        status=Turn.Status.QUEUED,
        pending_tool_calls=[{"id": "c1"}],
        error={"type": "network", "n": 1.5},
    )
    ((read_turn, read_agent),) = rows.fetch(
        f"SELECT {rows.columns(Turn, 't')}, {rows.columns(Agent, 'a')} FROM inference_turn t "
        "JOIN agentops_agent a ON a.id = t.agent_id WHERE t.id = %s",
        [turn.pk],
        Turn,
        Agent,
    )
    assert _values(read_turn) == _values(Turn.objects.get(pk=turn.pk))
    assert _values(read_agent) == _values(Agent.objects.get(pk=agent.pk))
    assert isinstance(read_turn, Turn) and read_turn.error == {
        "type": "network",
        "n": 1.5,
    }  # JSON decoded, not its text


def test_an_update_by_hand_converts_values_as_the_orm_does() -> None:
    turn = TurnFactory.create(status=Turn.Status.RUNNING)
    assert (
        rows.update(
            Turn,
            turn.pk,
            output={"content": "done"},
            status=Turn.Status.SUCCEEDED,
            pending_tool_calls=[],
        )
        == 1
    )
    turn.refresh_from_db()
    assert (turn.output, turn.status, turn.pending_tool_calls) == (
        {"content": "done"},
        Turn.Status.SUCCEEDED,
        [],
    )
    assert rows.update(Turn, turn.pk + 1000, status=Turn.Status.FAILED) == 0


def test_history_append_numbers_rows_in_order_per_agent() -> None:
    one, other = AgentFactory.create(), AgentFactory.create()
    first = history_append(
        agent=one,
        participant="alice",
        role=HistoryRow.Role.USER,
        content=[{"type": "text", "text": "a"}],
    )
    history_append(agent=other, participant="bob", role=HistoryRow.Role.USER, content="b")
    second = history_append(agent=one, participant="alice", role=HistoryRow.Role.USER, content="c")
    assert (first.seq, second.seq) == (1, 2)
    assert list(
        HistoryRow.objects.filter(agent=one).order_by("seq").values_list("seq", "content")
    ) == [(1, [{"type": "text", "text": "a"}]), (2, "c")]
    assert _values(HistoryRow.objects.get(pk=second.pk)) == _values(second)
