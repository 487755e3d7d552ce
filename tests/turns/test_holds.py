"""Provider waits through a real worker: holds, joins, release, ephemeral runs
(architecture.md §6.6, §6.9)."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent, HistoryRow
from inference.models import InferenceCall, Turn
from tests.conftest import gap_s, wait_for
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("workers")]


def test_a_stated_400ms_wait_holds_the_turn_and_one_call_carries_both_messages(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent(model="error:status=429,form=retry-after-ms,wait_ms=1500,times=1")
    turn_id = submit(api, agent.name, ("alice", "first"))["id"]
    held = wait_turn(api, turn_id, {"held"}, timeout=10)
    assert held["held_until"] is not None and "provider wait" in held["hold_reason"]
    joined = submit(api, agent.name, ("bob", "second"))
    assert joined["joined"] is True and joined["id"] == turn_id
    assert len(standin_requests()) == 1  # the message during the hold made no call

    turn = wait_turn(api, turn_id, {"succeeded", "failed"}, timeout=15)
    assert turn["status"] == "succeeded"
    requests = standin_requests()
    assert len(requests) == 2
    texts = [m["content"] for m in requests[1]["body"]["messages"] if m["role"] == "user"]
    assert texts == ["alice: first", "bob: second"]
    assert [c["outcome"] for c in turn["calls"]] == ["error", "completed"]
    assert not HistoryRow.objects.filter(agent=agent, role="system-note").exists()
    assert api.get(f"/api/v1/agents/{agent.name}").json()["failure_streak"] == 0


def test_a_stated_20_minute_wait_is_not_capped_and_a_release_resumes_the_turn_at_once(
    api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="error:status=429,form=retry-after,wait_ms=1200000,times=1")
    turn_id = submit(api, agent.name, ("alice", "hello"))["id"]
    held = wait_turn(api, turn_id, {"held"}, timeout=10)
    until = datetime.fromisoformat(held["held_until"])
    assert (
        timedelta(minutes=19, seconds=50)
        < until - datetime.fromisoformat(held["calls"][0]["ended_at"])
        < timedelta(minutes=20, seconds=5)
    )
    waits = api.get(f"/api/v1/waits?agent={agent.name}").json()
    assert waits["journal_readable"] is True and [w["model"] for w in waits["waits"]] == [
        agent.model
    ]

    started = time.monotonic()
    response = api.post(
        "/api/v1/waits/release",
        data=json.dumps({"agent": agent.name, "reason": "provider fixed"}),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    assert [r["release"] for r in response.json()["receipts"]] == ["recorded"]
    wait_turn(api, turn_id, {"succeeded"}, timeout=10)
    assert time.monotonic() - started < 5
    first, second = InferenceCall.objects.filter(agent=agent).order_by("id")
    # The release falls back to the service's own 429 pacing (2 s in these workers), no less.
    assert 2.0 <= gap_s(second, first) < 5


def test_an_ephemeral_run_sleeps_a_short_stated_wait_and_retries(
    api: Client, make_agent: Any
) -> None:
    agent = make_agent(
        model="error:status=429,form=retry-after-ms,wait_ms=300,times=1", kind=Agent.Kind.EPHEMERAL
    )
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hi"))["id"], timeout=15)
    assert turn["status"] == "succeeded"
    first, second = InferenceCall.objects.filter(agent=agent).order_by("id")
    assert 0.3 <= gap_s(second, first) < 1.5
    assert Turn.objects.get(pk=turn["id"]).hold_until is None


@pytest.mark.parametrize(
    ("wait_ms", "asked"), [("1200000", "1200 s"), ("nan", "longer than can be represented")]
)
def test_an_ephemeral_run_ends_at_once_on_a_wait_it_does_not_sleep(
    api: Client, make_agent: Any, wait_ms: str, asked: str
) -> None:
    agent = make_agent(
        model=f"error:status=429,form=retry-after-ms,wait_ms={wait_ms}", kind=Agent.Kind.EPHEMERAL
    )
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hi"))["id"], timeout=15)
    assert turn["status"] == "exhausted"
    assert (
        f"the provider asked to wait {asked}; an ephemeral run doesn't sleep a stated wait "
        "longer than 600 s, so it ends now" in turn["error"]["message"]
    )
    assert InferenceCall.objects.filter(agent=agent).count() == 1


def test_another_model_of_the_same_agent_proceeds(api: Client, make_agent: Any) -> None:
    agent = make_agent(model="error:status=429,form=retry-after,wait_ms=1200000,times=1")
    turn_id = submit(api, agent.name, ("alice", "hello"))["id"]
    wait_turn(api, turn_id, {"held"}, timeout=10)
    # Switching the model is not a release, but the other model is not held.
    response = api.patch(
        f"/api/v1/agents/{agent.name}",
        data=json.dumps({"model": "answer"}),
        content_type="application/json",
    )
    assert response.status_code == 200
    from interfaces.tasks import agent_drain

    agent_drain.delay(agent.pk)
    turn = wait_turn(api, turn_id, {"succeeded"}, timeout=10)
    assert turn["calls"][-1]["model"] == "answer"
    waits = api.get(f"/api/v1/waits?agent={agent.name}").json()["waits"]
    assert [w["model"] for w in waits] == [
        "error:status=429,form=retry-after,wait_ms=1200000,times=1"
    ]


def test_an_unreadable_journal_holds_every_turn_and_a_repair_resumes_it_without_an_operator(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    import uuid

    from django.utils import timezone

    from waits.journal import JOURNAL_POLL_MS
    from waits.models import WaitJournalEntry

    bad = WaitJournalEntry.objects.create(act_id=uuid.uuid4(), kind="pause", at=timezone.now())
    # A worker reads new rows at most every JOURNAL_POLL_MS: one that read the journal just
    # before the row appeared (another test's held turn re-checking) would let the turn run.
    # After one poll interval, every worker's next admission check reads the row (nothing
    # outside a worker shows when it last read the journal).
    time.sleep(JOURNAL_POLL_MS / 1000 + 0.1)
    agent = make_agent(model="answer")
    turn_id = submit(api, agent.name, ("alice", "hello"))["id"]
    held = wait_turn(api, turn_id, {"held"}, timeout=10)
    assert held["held_until"] is None and "provider wait on *" in held["hold_reason"]
    # This process reads the journal too; it sees the new row at its next poll (500 ms).
    wait_for(
        lambda: api.get("/api/v1/waits").json()["journal_readable"] is False,
        timeout=3,
        what="the API to see the bad row",
    )
    assert standin_requests() == []

    WaitJournalEntry.objects.filter(pk=bad.pk).delete()  # the repair: the operator removes the row
    turn = wait_turn(api, turn_id, {"succeeded"}, timeout=15)
    assert len(turn["calls"]) == 1
