"""Turns through real Celery workers and the stand-in provider over sockets
(architecture.md §5.1)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent, HistoryRow
from inference.models import InferenceCall, Turn
from interfaces.tasks import agent_drain
from tests.conftest import wait_for
from turns.drain import run_end
from turns.lease import lease_claim
from turns.runtime import TurnRuntime

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("workers")]

ENDED = {"succeeded", "failed", "exhausted", "cancelled", "requires_action"}


def submit(api: Client, agent: str, *messages: tuple[str, str]) -> dict[str, Any]:
    body = {"messages": [{"participant": p, "content": c} for p, c in messages]}
    response = api.post(
        f"/api/v1/agents/{agent}/turns", data=json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 202, response.content
    return response.json()


def wait_turn(
    api: Client, turn_id: int, statuses: set[str] = ENDED, timeout: float = 30
) -> dict[str, Any]:
    return wait_for(
        lambda: (body := api.get(f"/api/v1/turns/{turn_id}").json())["status"] in statuses and body,
        timeout=timeout,
        what=f"turn {turn_id} to reach {sorted(statuses)}",
    )


def workers_had_their_chance(api: Client, make_agent: Any) -> None:
    """Return once another agent's turn, submitted now, has succeeded: the workers have taken
    every task queued before it (they take them in queue order) and had as long as a call takes
    to act on them. The evidence a test needs before it asserts that something did not run."""
    probe = make_agent(model="answer:delay_ms=300")
    assert wait_turn(api, submit(api, probe.name, ("probe", "hi"))["id"])["status"] == "succeeded"


def content_flowing(api: Client, turn_id: int) -> bool:
    """The turn's call is out and its content has begun to arrive (as GET /turns shows it)."""
    calls = api.get(f"/api/v1/turns/{turn_id}").json()["calls"]
    return bool(calls) and calls[-1]["first_content_at"] is not None


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [True, False])
def test_a_turn_lands_its_answer_in_history_with_a_timeline(
    api: Client, make_agent: Any, provider: str, stream: bool
) -> None:
    agent = make_agent(provider=provider, model="answer:chunks=4", stream=stream)
    accepted = submit(api, agent.name, ("alice", "Hello there"))
    assert accepted["status"] == "queued" and accepted["joined"] is False

    turn = wait_turn(api, accepted["id"])
    assert turn["status"] == "succeeded", turn
    assert turn["output"]["content"] == "Stand-in answer to: alice: Hello there"
    history = api.get(f"/api/v1/agents/{agent.name}/history").json()
    assert [(r["participant"], r["role"]) for r in history] == [
        ("alice", "user"),
        (agent.name, "assistant"),
    ]
    assert history[1]["content"] == [
        {"type": "text", "text": "Stand-in answer to: alice: Hello there"}
    ]

    [call] = turn["calls"]
    assert (
        call["kind"] == "primary" and call["outcome"] == "completed" and call["streamed"] is stream
    )
    for field in ("sent_at", "first_event_at", "first_content_at", "last_event_at", "ended_at"):
        assert call[field] is not None, field
    assert (
        call["sent_at"]
        <= call["first_event_at"]
        <= call["first_content_at"]
        <= call["last_event_at"]
        <= call["ended_at"]
    )
    if stream:
        # 4 text deltas + block start/stop (anthropic) or finish chunk (openai), all model events;
        # role/usage chunks, message_start/delta and [DONE] are keepalives (the response's
        # headers are not: they have their own instant).
        assert call["model_events"] >= 5
        assert call["keepalives"] >= 2
    else:
        assert call["model_events"] == 1 and call["keepalives"] == 0
    assert turn["ended_at"] is not None


def test_a_task_delivered_twice_stores_one_assistant_row(api: Client, make_agent: Any) -> None:
    agent = make_agent(model="answer:delay_ms=300")
    accepted = submit(api, agent.name, ("alice", "once"))
    for _ in range(3):
        agent_drain.delay(agent.pk)
    wait_turn(api, accepted["id"])
    # Delivered again after it ended.
    agent_drain.delay(agent.pk)
    agent_drain.delay(agent.pk)
    wait_for(
        lambda: not Turn.objects.filter(agent=agent, status__in=Turn.OPEN).exists(),
        what="agent idle",
    )
    workers_had_their_chance(api, make_agent)  # the late deliveries, to run a second call
    assert HistoryRow.objects.filter(agent=agent, role="assistant").count() == 1
    assert InferenceCall.objects.filter(agent=agent).count() == 1


def test_two_workers_never_run_two_calls_for_one_agent_and_queued_messages_join(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent(model="answer:delay_ms=700")
    first = submit(api, agent.name, ("alice", "first"))
    wait_for(
        lambda: Turn.objects.get(pk=first["id"]).status == "running", what="first turn running"
    )
    second = submit(api, agent.name, ("bob", "second"))
    third = submit(api, agent.name, ("carol", "third"))
    assert second["joined"] is False and third["joined"] is True and third["id"] == second["id"]
    # More deliveries than needed, to both workers.
    for _ in range(4):
        agent_drain.delay(agent.pk)
    wait_turn(api, first["id"])
    last = wait_turn(api, second["id"])
    assert last["status"] == "succeeded"
    calls = list(InferenceCall.objects.filter(agent=agent).order_by("sent_at"))
    assert len(calls) == 2
    assert calls[0].ended_at is not None and calls[1].sent_at is not None
    assert calls[0].ended_at <= calls[1].sent_at, "two calls for one agent overlapped"
    # The joined turn's one call carried both queued messages.
    second_request = standin_requests()[-1]["body"]["messages"]
    texts = [m["content"] for m in second_request if m["role"] == "user"]
    assert "bob: second" in texts and "carol: third" in texts
    assert Turn.objects.get(pk=second["id"]).trigger_rows.count() == 2


def test_a_turn_submitted_as_a_run_ends_runs_once_that_run_releases_the_lease(
    api: Client, make_agent: Any, runtime: TurnRuntime
) -> None:
    """A run's last look found no turn; a turn submitted before it releases the lease is
    delivered to a worker that finds the lease held and does nothing. The run's release looks
    once more and sends the agent on, rather than leave the turn to the sweep (which these
    workers do not run)."""
    agent = make_agent(model="answer")
    ending = lease_claim(
        runtime.leases, agent.pk
    )  # the ending run's lease, held here in the test process
    assert ending is not None
    accepted = submit(api, agent.name, ("alice", "Hello"))
    # Delivered: a worker took the task and found the lease held (were it free, the turn would
    # have run as the probe's did).
    workers_had_their_chance(api, make_agent)
    assert api.get(f"/api/v1/turns/{accepted['id']}").json()["status"] == "queued"
    runtime.submit(run_end(runtime, ending, idle=True)).result(10)
    assert wait_turn(api, accepted["id"], timeout=10)["status"] == "succeeded"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_tool_round_trip_goes_through_requires_action(
    api: Client, make_agent: Any, provider: str
) -> None:
    agent = make_agent(
        provider=provider,
        model="tool",
        tools=[
            {
                "name": "lookup",
                "description": "Look up",
                "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
            }
        ],
    )
    accepted = submit(api, agent.name, ("alice", "what is 2+2"))
    turn = wait_turn(api, accepted["id"])
    assert turn["status"] == "requires_action", turn
    [tool_call] = turn["output"]["tool_calls"]
    assert tool_call["name"] == "lookup" and tool_call["arguments"] == {
        "query": "alice: what is 2+2"
    }
    assert turn["pending_tool_calls"] == [tool_call]

    response = api.post(
        f"/api/v1/turns/{accepted['id']}/tool_results",
        data=json.dumps({"results": [{"tool_call_id": tool_call["id"], "content": "4"}]}),
        content_type="application/json",
    )
    assert response.status_code == 202
    turn = wait_turn(api, accepted["id"], {"succeeded", "failed"})
    assert turn["status"] == "succeeded"
    assert turn["output"]["content"] == "Tool result received: 4"
    assert turn["rounds"] == 2 and len(turn["calls"]) == 2
    roles = list(
        HistoryRow.objects.filter(agent=agent).order_by("seq").values_list("role", flat=True)
    )
    assert roles == ["user", "assistant", "tool", "assistant"]


def test_a_running_turn_is_cancelled_and_not_retried(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent(model="endless:interval_ms=20")
    accepted = submit(api, agent.name, ("alice", "go on forever"))
    wait_for(standin_requests, what="the call to reach the provider")
    # Content flowing, so the cancel lands mid-call.
    wait_for(lambda: content_flowing(api, accepted["id"]), what="the call's first content")
    response = api.post(f"/api/v1/turns/{accepted['id']}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    wait_for(
        lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).exists(),
        what="the call to end",
    )
    call = InferenceCall.objects.get(agent=agent)
    assert call.outcome == "aborted"
    assert Turn.objects.get(pk=accepted["id"]).status == "cancelled"
    assert not HistoryRow.objects.filter(agent=agent, role="assistant").exists()
    assert InferenceCall.objects.filter(agent=agent).count() == 1


def test_a_cancel_reaches_the_running_call_within_a_short_bound(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    """The cancel is pushed to the worker holding the call, not found by its next poll (the
    old poller looked every 250 ms): from the cancel request to the call's end, well under that."""
    agent = make_agent(model="endless:interval_ms=20")
    accepted = submit(api, agent.name, ("alice", "go on forever"))
    wait_for(standin_requests, what="the call to reach the provider")
    # Content flowing, so the cancel lands mid-call.
    wait_for(lambda: content_flowing(api, accepted["id"]), what="the call's first content")
    asked = time.time()
    assert api.post(f"/api/v1/turns/{accepted['id']}/cancel").status_code == 200
    call = wait_for(
        lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).first(),
        what="the call to end",
    )
    assert call.outcome == "aborted" and call.ended_at is not None
    took = call.ended_at.timestamp() - asked
    assert took < 0.15, f"the cancel took {took * 1000:.0f} ms to abort the call"


def test_an_auth_failure_fails_the_turn_with_a_note(api: Client, make_agent: Any) -> None:
    agent = make_agent(model="auth")
    accepted = submit(api, agent.name, ("alice", "hi"))
    turn = wait_turn(api, accepted["id"])
    assert turn["status"] == "failed"
    assert turn["error"]["type"] == "auth" and turn["error"]["http_status"] == 401
    assert turn["note"].startswith("[inference-failed] The model call failed (auth, HTTP 401): ")
    assert turn["note"].endswith("If a reply is still owed from that turn, you can give it now.")
    note = HistoryRow.objects.get(agent=agent, role="system-note")
    assert note.content == turn["note"]
    assert Agent.objects.get(pk=agent.pk).turns.count() == 1
