"""Failure notes are for people, not models (architecture.md §5.8): the service's own notes
(``[inference-failed]``, ``[context-trim]``, the breaker's) never end a request, and a turn
whose only unanswered rows are notes ends without a call, saying nothing is left to answer.
Through real workers and the stand-in, which answers the last user message it was sent."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import transaction
from django.test import Client

from agentops.models import Agent, HistoryRow
from calls.compile import compile_request
from inference.models import InferenceCall, Turn
from tests.conftest import wait_for
from tests.factories import HistoryRowFactory
from turns.services import turn_queue_retry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("workers")]

FAILED = "[inference-failed] The model call failed (auth, HTTP 401): refused."
REWIND = "[refusal-rewind] The 1 most recent turn(s) were set aside because ..."


def history(agent: Agent, *rows: tuple[str, Any]) -> list[HistoryRow]:
    """Rows in order: (role, content); a user row is alice's, an assistant row the agent's."""
    made = []
    for seq, (role, content) in enumerate(rows, start=1):
        participant = {"user": "alice", "assistant": agent.participant}.get(role, "agentops")
        made.append(
            HistoryRowFactory.create(
                agent=agent, seq=seq, role=role, participant=participant, content=content
            )
        )
    return made


def retried(agent: Agent) -> dict[str, Any]:
    """A turn over the history as it stands (as the breaker queues one after a shed), ended."""
    with transaction.atomic():
        turn_queue_retry(agent=agent)
    turn = Turn.objects.filter(agent=agent).latest("id")
    wait_for(lambda: Turn.objects.get(pk=turn.pk).status in Turn.ENDED, what="the turn to end")
    return dict(Turn.objects.values("status", "output", "error").get(pk=turn.pk))


def last_sent(standin_requests: Any) -> dict[str, Any]:
    (request,) = standin_requests()
    return request["body"]["messages"][-1]


def test_a_retry_over_a_failed_turn_answers_the_turn_not_its_note(
    make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent()
    history(agent, ("user", "what time is it?"), ("system-note", FAILED))
    turn = retried(agent)
    assert turn["status"] == "succeeded"
    assert turn["output"]["content"] == "Stand-in answer to: alice: what time is it?"
    messages = standin_requests()[0]["body"]["messages"]
    assert [m["content"] for m in messages] == [FAILED, "alice: what time is it?"]


def test_a_note_moves_before_the_newest_participants_row_not_between_a_tool_call_and_result(
    make_agent: Any,
) -> None:
    agent = make_agent()
    call = {"type": "tool_call", "id": "c1", "name": "clock", "arguments": {}}
    result = {"type": "tool_result", "tool_call_id": "c1", "content": "noon"}
    rows = history(
        agent,
        ("user", "time?"),
        ("assistant", [call]),
        ("tool", [result]),
        ("system-note", FAILED),
    )
    sent = compile_request(agent, rows).messages
    assert [m.blocks[0]["type"] for m in sent] == ["text", "text", "tool_call", "tool_result"]
    assert sent[0].blocks[0]["text"] == FAILED


def test_a_turn_with_only_notes_after_the_agents_answer_ends_without_a_call(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent()
    # The breaker set the newest turn aside: what is left after the agent's answer are notes.
    history(
        agent,
        ("user", "hello"),
        ("assistant", "hi alice"),
        ("system-note", FAILED),
        ("system-note", REWIND),
    )
    turn = retried(agent)
    assert turn["status"] == "succeeded" and turn["error"] is None
    assert turn["output"] == {"content": "", "stop_reason": "nothing_to_answer", "tool_calls": []}
    assert not InferenceCall.objects.filter(agent=agent).exists()
    assert standin_requests() == []
    # The next message is answered as usual, the notes before it.
    body = {"messages": [{"participant": "alice", "content": "still there?"}]}
    submitted = api.post(
        f"/api/v1/agents/{agent.name}/turns", data=json.dumps(body), content_type="application/json"
    ).json()
    wait_for(
        lambda: Turn.objects.get(pk=submitted["id"]).status == Turn.Status.SUCCEEDED,
        what="the next turn",
    )
    assert last_sent(standin_requests)["content"] == "alice: still there?"


def test_nothing_to_answer_is_read_from_the_rows_after_the_answer_and_the_turns_own() -> None:
    """The rule alone (no database): notes after the newest answer ask nothing; a participant's
    row after it does; and a row the turn was submitted for asks even before that answer (it
    joined while the previous call ran). The turn's rows are read only when the rest says
    nothing is asked."""
    from agentops.models import HistoryRow
    from calls.compile import nothing_to_answer

    def row(pk: int, role: str) -> HistoryRow:
        return HistoryRow(pk=pk, role=role, content="x")

    user, answer, note = (
        HistoryRow.Role.USER,
        HistoryRow.Role.ASSISTANT,
        HistoryRow.Role.SYSTEM_NOTE,
    )
    joined, answered, noted = row(1, user), row(2, answer), row(3, note)
    assert nothing_to_answer([joined, answered, noted])
    assert not nothing_to_answer([joined, answered, noted], lambda: {1})
    assert nothing_to_answer([joined, answered, noted], lambda: {3})  # a note asks nothing
    assert not nothing_to_answer([answered, row(4, user)])
    assert nothing_to_answer([])

    def unread() -> set[int]:
        raise AssertionError("the turn's rows were read though a row asks already")

    assert not nothing_to_answer([answered, row(4, user)], unread)
