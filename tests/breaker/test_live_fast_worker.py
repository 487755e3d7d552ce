"""The breaker through a real worker whose retries, bounds and turn lease are short
(architecture.md §7).

Server errors and cuts are retried and re-armed before a turn fails, minutes with the default
settings; this module's worker does it in seconds, so a failure that may not shed can be driven
to the threshold live. Its turn lease is 2 s, so a probe out longer than that must renew it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agentops.models import Agent, Alert, HistoryRow
from inference.models import AgentLease, InferenceCall, Turn
from tests.breaker.test_live import alerts, streak_reached
from tests.breaker.test_live_moves import probe_out, probe_status, probes, sequence
from tests.conftest import WorkerPool, wait_for, worker_pool
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True)]

LEASE_MS = 2000
# A streamed call that sends no content is cut after 0.5 s; a non-streamed one (the probe) at
# sent + 0.5 s + max_tokens / 87 s.
BOUNDS = {
    "progress_bounds": {
        "before_content_ms": 500,
        "between_events_ms": 500,
        "think_tokens_per_second": 87,
    }
}
POOL_ENV = {
    "AGENTOPS_INFERENCE_BOUNDS": json.dumps(BOUNDS),
    # A 5xx: one base retry (1 to 1.5 s) spends the episode, one re-arm 0.1 s later, the same
    # again, then the turn is exhausted. A cut: one fresh call 0.1 s later, cut again, failed.
    "AGENTOPS_RETRY_EPISODE_MS": "900",
    "AGENTOPS_REARM_DELAYS_MS": "100",
    "AGENTOPS_DEADLINE_RETRY_DELAY_MS": "100",
    "AGENTOPS_BREAKER_THRESHOLD": "3",
    "AGENTOPS_BREAKER_SHED_CAP": "3",
    "AGENTOPS_TURN_LEASE_MS": str(LEASE_MS),
}
FAILED = {"failed", "exhausted"}


@pytest.fixture(scope="module")
def fast_pool(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(1, label="breaker-fast", extra_env=POOL_ENV)


@pytest.fixture
def fast(fast_pool: WorkerPool) -> WorkerPool:
    return fast_pool.routed()


def fail_turn(api: Client, agent: Agent, number: int) -> dict[str, Any]:
    turn = wait_turn(
        api,
        submit(api, agent.name, ("alice", f"message {number}"))["id"],
        statuses=FAILED | {"succeeded"},
    )
    assert turn["status"] in FAILED, turn
    wait_for(partial(streak_reached, agent, number), what=f"the streak to reach {number}")
    return turn


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("model", "failure"), [("error:status=503", "server"), ("pings:interval_ms=50", "timeout")]
)
def test_a_server_error_or_a_cut_retried_to_failure_sends_no_probe_sheds_nothing_and_raises_hard_down_at_the_threshold(
    api: Client,
    make_agent: Any,
    fast: WorkerPool,
    model: str,
    failure: str,
) -> None:
    agent = make_agent(model=model)
    started = time.monotonic()
    for number in (1, 2):
        turn = fail_turn(api, agent, number)
        assert turn["error"]["type"] == failure, turn
    assert alerts(agent, "hard-down") == 0  # below the threshold
    fail_turn(api, agent, 3)
    wait_for(lambda: alerts(agent, "hard-down") == 1, what="hard-down at the threshold")
    # Each turn went through its retries (a 5xx also through its re-arm) before it failed.
    calls = InferenceCall.objects.filter(agent=agent, kind="primary").count()
    assert calls >= 6 if failure == "timeout" else calls >= 12, calls
    assert not probes(agent).exists()
    assert not HistoryRow.objects.filter(agent=agent, state="set_aside").exists()
    assert HistoryRow.objects.filter(agent=agent, role="user", state="presented").count() == 3
    assert not Alert.objects.filter(kind="history-kept", agent=agent.name).exists()
    assert Turn.objects.filter(agent=agent).count() == 3  # no retry queued by the breaker
    assert time.monotonic() - started < 40


def lease_of(agent: Agent) -> AgentLease | None:
    return AgentLease.objects.filter(agent=agent).first()


@pytest.mark.timeout(60)
def test_the_drain_keeps_renewing_its_turn_lease_while_a_slow_probe_is_out_and_the_answer_still_sheds(
    api: Client,
    make_agent: Any,
    fast: WorkerPool,
) -> None:
    # The probe is answered after 3 lease lengths (its whole-call bound: 0.5 s + 870 / 87 s).
    agent = make_agent(
        model=sequence("refuse", "refuse", "refuse", f"answer:delay_ms={3 * LEASE_MS}", "answer"),
        max_tokens=870,
    )
    for number in (1, 2, 3):
        fail_turn(api, agent, number)
    probe = probe_out(agent)
    lease = lease_of(agent)
    assert lease is not None
    owner, first_until = lease.owner, lease.until
    # Past the end of the lease as first read (the probe is out for 3 leases): unrenewed, it
    # would have lapsed.
    lapsed = first_until + timedelta(milliseconds=LEASE_MS / 4)
    wait_for(lambda: timezone.now() > lapsed, timeout=LEASE_MS * 2 / 1000, what="the lease's end")
    assert probes(agent).get().outcome is None, "the probe must still be out"
    lease = lease_of(agent)
    assert lease is not None and lease.owner == owner
    assert lease.until > first_until and lease.until > timezone.now(), (
        lease.until,
        first_until,
        timezone.now(),
    )
    # The answer came back to a lease still held: it sheds the newest turn and the retry runs.
    wait_for(
        lambda: Turn.objects.filter(agent=agent, status="succeeded").exists(),
        timeout=20,
        what="the retry to succeed",
    )
    probe.refresh_from_db()
    assert probe.outcome == "completed"
    assert probe.ended_at is not None and probe.sent_at is not None
    assert (probe.ended_at - probe.sent_at).total_seconds() >= 3 * LEASE_MS / 1000
    assert probe.probe_verdict == "answered"
    set_aside = HistoryRow.objects.filter(agent=agent, state="set_aside").order_by("seq")
    assert [r.content for r in set_aside] == ["message 3"]


@pytest.mark.timeout(60)
def test_a_probe_whose_drain_lost_its_turn_lease_is_aborted_and_sheds_nothing(
    api: Client,
    make_agent: Any,
    fast: WorkerPool,
) -> None:
    # Answered only after 8 s, unless the drain aborts it first.
    agent = make_agent(
        model=sequence("refuse", "refuse", "refuse", "answer:delay_ms=8000", "answer"),
        max_tokens=870,
    )
    for number in (1, 2, 3):
        fail_turn(api, agent, number)
    probe = probe_out(agent)
    # Another worker takes the lease over (as if this drain had failed to renew in time).
    stolen = AgentLease.objects.filter(agent=agent).update(
        owner="thief", until=timezone.now() + timedelta(minutes=5)
    )
    assert stolen == 1
    stolen_at = time.monotonic()
    try:
        wait_for(
            lambda: probes(agent).get().outcome is not None, timeout=6, what="the probe to end"
        )
        assert time.monotonic() - stolen_at < 4  # at the next renewal, well before the answer
        probe.refresh_from_db()
        assert probe.outcome == "aborted"
        wait_for(lambda: probe_status(agent) == "unclear", what="the probe's verdict")
        probe.refresh_from_db()
        assert probe.probe_verdict == "unclear"
        assert not HistoryRow.objects.filter(agent=agent, state="set_aside").exists()
        assert Turn.objects.filter(agent=agent).count() == 3  # no retry
        alert = wait_for(
            lambda: Alert.objects.filter(kind="history-kept", agent=agent.name).first(),
            what="the history-kept alert",
        )
        assert alert.verdict == "unclear"
        lease = lease_of(agent)
        assert lease is not None and lease.owner == "thief"
    finally:
        AgentLease.objects.filter(agent=agent, owner="thief").delete()
