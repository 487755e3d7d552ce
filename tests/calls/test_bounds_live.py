"""Progress bounds and the error policy through a real worker and the stand-in over sockets.

Bounds are set in milliseconds for this module's own worker (architecture.md §5.3 to §5.8)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from agentops.models import Alert, HistoryRow
from agentops.text import FAILURE_TEXT_LIMIT
from inference.models import InferenceCall, Turn
from tests.conftest import LOG_DIR, WorkerPool, gap_s, worker_pool
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True)]

BOUNDS = {
    "progress_bounds": {
        "before_content_ms": 500,
        "between_events_ms": 500,
        "think_tokens_per_second": 87,
    },
    "flat_minimum_ms": 2000,
    "absolute_ms": 2500,
}
POOL_ENV = {
    "AGENTOPS_INFERENCE_BOUNDS": json.dumps(BOUNDS),
    "AGENTOPS_RETRY_EPISODE_MS": "3000",
    "AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS": "200",
    "AGENTOPS_REARM_DELAYS_MS": "300,300",
}
FAILURES_LOG = LOG_DIR / f"failures-bounded-{os.getpid()}.log"


@pytest.fixture(scope="module")
def bounded_pool(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    FAILURES_LOG.unlink(missing_ok=True)
    yield from worker_pool(
        1, label="bounded", extra_env={**POOL_ENV, "AGENTOPS_FAILURES_LOG": str(FAILURES_LOG)}
    )


@pytest.fixture(scope="module")
def unbounded_pool(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(1, label="unbounded", extra_env={"AGENTOPS_INFERENCE_BOUNDS": "false"})


@pytest.fixture
def bounded(bounded_pool: WorkerPool) -> WorkerPool:
    return bounded_pool.routed()


@pytest.fixture
def unbounded(unbounded_pool: WorkerPool) -> WorkerPool:
    return unbounded_pool.routed()


def calls_of(turn: dict[str, Any]) -> list[dict[str, Any]]:
    return turn["calls"]


BEFORE_CONTENT_MESSAGE = (
    "no content for 500 ms after the request was sent (before-content bound; "
    "the setting for this bound: AGENTOPS_INFERENCE_BOUNDS.progress_bounds.before_content_ms)"
)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "scenario", ["pings:interval_ms=50", "comments:interval_ms=50", "empty-deltas:interval_ms=50"]
)
def test_a_keepalive_only_stream_is_cut_before_content(
    bounded: WorkerPool, api: Client, make_agent: Any, provider: str, scenario: str
) -> None:
    agent = make_agent(provider=provider, model=scenario)
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert turn["status"] == "failed", turn
    first, second = calls_of(turn)
    for call in (first, second):
        assert call["outcome"] == "cut" and call["bound"] == "before_content"
        assert call["first_content_at"] is None
        assert call["keepalives"] >= 5, call  # keepalives kept coming and moved nothing
        assert (
            call["error"]["type"] == "timeout"
            and call["error"]["message"] == BEFORE_CONTENT_MESSAGE
        )
        assert 0 <= call["cut_lateness_ms"] < 300
    assert turn["note"] == (
        f"[inference-failed] The model call timed out: {BEFORE_CONTENT_MESSAGE}. "
        "The call was made again, and it timed out again. "
        "If a reply is still owed from that turn, you can give it now."
    )


def test_a_stream_silent_after_content_is_cut_between_events(
    bounded: WorkerPool, api: Client, make_agent: Any
) -> None:
    agent = make_agent(provider="anthropic", model="silent-after-content:after_chunks=2")
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    call = calls_of(turn)[0]
    assert call["outcome"] == "cut" and call["bound"] == "between_events"
    assert call["first_content_at"] is not None
    assert call["error"]["message"].startswith(
        "no model event for 500 ms after content (between-events bound"
    )
    assert call["error"]["message"].endswith(
        "AGENTOPS_INFERENCE_BOUNDS.progress_bounds.between_events_ms)"
    )


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_thinking_block_is_not_cut_before_its_allowance_ends(
    bounded: WorkerPool, api: Client, make_agent: Any, provider: str
) -> None:
    # 174 tokens at 87 tokens/s: a 2000 ms allowance, longer than the 500 ms before-content bound.
    agent = make_agent(provider=provider, model="think:silent_ms=1200", max_tokens=174)
    turn = wait_turn(api, submit(api, agent.name, ("alice", "think"))["id"])
    assert turn["status"] == "succeeded", turn
    [call] = calls_of(turn)
    assert call["outcome"] == "completed"


def test_a_short_thinking_allowance_does_not_save_a_silent_thinking_block(
    bounded: WorkerPool, api: Client, make_agent: Any
) -> None:
    # 20 tokens at 87 tokens/s: a 230 ms allowance, shorter than the 500 ms bound, so it applies.
    agent = make_agent(provider="anthropic", model="think:silent_ms=1200", max_tokens=20)
    turn = wait_turn(api, submit(api, agent.name, ("alice", "think"))["id"])
    call = calls_of(turn)[0]
    assert call["outcome"] == "cut" and call["bound"] == "before_content"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_stream_that_keeps_sending_content_is_cut_only_by_the_absolute_bound(
    bounded: WorkerPool, api: Client, make_agent: Any, provider: str
) -> None:
    agent = make_agent(provider=provider, model="endless:interval_ms=20")
    turn = wait_turn(api, submit(api, agent.name, ("alice", "go"))["id"], timeout=40)
    call = calls_of(turn)[0]
    assert call["outcome"] == "cut" and call["bound"] == "absolute"
    assert call["model_events"] > 50


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_trickling_unstreamed_body_is_cut_by_the_whole_call_bound(
    bounded: WorkerPool, api: Client, make_agent: Any, provider: str
) -> None:
    # whole call = setup (500) + allowance (87 tokens: 1000 ms) = 1500 ms
    agent = make_agent(
        provider=provider, model="trickle:interval_ms=50", stream=False, max_tokens=87
    )
    turn = wait_turn(api, submit(api, agent.name, ("alice", "go"))["id"])
    call = calls_of(turn)[0]
    assert call["outcome"] == "cut" and call["bound"] == "whole_call"
    sent = call["sent_at"]
    from datetime import datetime

    span = (datetime.fromisoformat(call["ended_at"]) - datetime.fromisoformat(sent)).total_seconds()
    assert 1.4 < span < 2.5


def test_a_cut_call_gets_exactly_one_fresh_call_about_a_second_later(
    bounded: WorkerPool, api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="silent")
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert turn["status"] == "failed"
    calls = list(InferenceCall.objects.filter(agent=agent).order_by("id"))
    assert len(calls) == 2
    gap = gap_s(calls[1], calls[0])
    assert 0.95 <= gap < 1.8
    assert turn["note"].count("The call was made again, and it timed out again.") == 1


def test_with_bounds_off_nothing_is_cut(
    unbounded: WorkerPool, api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="pings:interval_ms=50,duration_ms=1500")
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert turn["status"] == "succeeded", turn
    [call] = calls_of(turn)
    assert call["outcome"] == "completed" and call["keepalives"] > 10


def test_server_errors_are_retried_with_growing_jittered_delays(
    bounded: WorkerPool, api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="error:status=500,times=2")
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"], timeout=30)
    assert turn["status"] == "succeeded", turn
    calls = list(InferenceCall.objects.filter(agent=agent).order_by("id"))
    assert [c.outcome for c in calls] == ["error", "error", "completed"]
    first_gap, second_gap = gap_s(calls[1], calls[0]), gap_s(calls[2], calls[1])
    assert 1.0 <= first_gap < 1.7 and 2.0 <= second_gap < 3.3


@pytest.mark.parametrize(
    ("scenario", "kind", "status"),
    [
        ("auth", "auth", 401),
        ("context-length", "context_length", 400),
        ("refuse", "invalid_request", 400),
        ("length-empty", "unknown", None),
    ],
)
def test_terminal_failures_are_not_retried(
    bounded: WorkerPool, api: Client, make_agent: Any, scenario: str, kind: str, status: int | None
) -> None:
    agent = make_agent(model=scenario)
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert turn["status"] == "failed"
    assert turn["error"]["type"] == kind and turn["error"]["http_status"] == status
    assert InferenceCall.objects.filter(agent=agent).count() == 1
    assert HistoryRow.objects.filter(agent=agent, role="system-note").count() == 1
    assert not Alert.objects.filter(agent=agent.name).exists()  # a failed turn is no alert


def test_the_retry_episode_ends_the_turn_as_exhausted_and_re_arms_it(
    bounded: WorkerPool, api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="error:status=503")
    turn_id = submit(api, agent.name, ("alice", "hello"))["id"]
    # Each run: calls at ~0, ~1, ~3 s, exhausted by the 3 s episode; re-armed twice (300 ms).
    turn = wait_turn(api, turn_id, {"exhausted"}, timeout=40)
    assert turn["error"]["type"] == "server"
    assert Turn.objects.get(pk=turn_id).rearms == 2
    assert InferenceCall.objects.filter(agent=agent).count() == 9
    assert HistoryRow.objects.filter(agent=agent, role="system-note").count() == 1


def test_an_exhausted_turn_raises_one_turn_exhausted_alert_with_the_agent_the_model_and_a_bounded_message(
    bounded: WorkerPool,
    api: Client,
    make_agent: Any,
) -> None:
    agent = make_agent(model="error:status=503,size=5000")
    turn_id = submit(api, agent.name, ("alice", "hello"))["id"]
    turn = wait_turn(api, turn_id, {"exhausted"}, timeout=40)
    # The re-arms end no turn: one alert, for the run that spent the ladder.
    [alert] = Alert.objects.filter(agent=agent.name)
    assert alert.kind == "turn-exhausted" and alert.model == agent.model
    assert alert.message.startswith(f"turn {turn_id} exhausted: ")
    assert len(alert.message) <= FAILURE_TEXT_LIMIT and "characters omitted]" in alert.message
    assert alert.data["turn"] == turn_id and alert.data["rearms"] == 2
    assert alert.data["error"]["type"] == "server" and alert.data["error"]["http_status"] == 503
    assert alert.data["error"]["message"] == turn["error"]["message"]
    lines = [json.loads(line) for line in FAILURES_LOG.read_text().splitlines()]
    [line] = [line for line in lines if line.get("alert") == alert.pk]
    assert (
        line["kind"] == "turn-exhausted"
        and line["agent"] == agent.name
        and line["model"] == agent.model
    )
    assert line["message"] == alert.message and line["data"] == alert.data


def test_a_1mb_provider_error_is_stored_and_noted_within_its_bounds(
    bounded: WorkerPool, api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="error:status=400,size=1000000")
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert turn["status"] == "failed"
    assert len(turn["error"]["message"]) <= 2000 and "omitted" in turn["error"]["message"]
    assert len(turn["calls"][0]["error"]["message"]) <= 2000
    note = HistoryRow.objects.get(agent=agent, role="system-note").content
    assert len(note) < 600 + 200


def test_another_failure_between_two_cuts_resets_the_cut_count(
    bounded: WorkerPool, api: Client, make_agent: Any
) -> None:
    # cut, rate limit (paced 200 ms here), cut, answer: each cut is the first of its run, so
    # each gets a fresh call.
    agent = make_agent(model="sequence:steps=silent|error%3Astatus%3D429|silent|answer")
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"], timeout=30)
    assert turn["status"] == "succeeded", turn
    assert [c["outcome"] for c in turn["calls"]] == ["cut", "error", "cut", "completed"]
