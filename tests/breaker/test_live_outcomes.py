"""The probe's outcomes through a real worker and the stand-in (architecture.md §7.3): a probe that
fails any other way than the failure did (a 429, another status, a cut, an abort by shutdown) sheds
nothing and queues no retry, and a ``history-kept`` alert says it couldn't tell; an answer that
comes back a minute later still sheds when nothing moved."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent, Alert, HistoryRow
from breaker.models import BreakerState
from inference.models import Turn
from tests.breaker.test_live import streak_reached
from tests.breaker.test_live_moves import nothing_shed, probe_out, probe_status, probes, sequence
from tests.conftest import WorkerPool, celery_app, wait_for, worker_pool
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True)]

# Small bounds for the cut: a non-streamed call is cut at sent + 0.5 s + max_tokens / 87 s.
BOUNDS = {
    "progress_bounds": {
        "before_content_ms": 500,
        "between_events_ms": 500,
        "think_tokens_per_second": 87,
    }
}


@pytest.fixture(scope="module")
def bounded_pool(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(
        1, label="breaker-bounded", extra_env={"AGENTOPS_INFERENCE_BOUNDS": json.dumps(BOUNDS)}
    )


@pytest.fixture
def bounded(bounded_pool: WorkerPool) -> WorkerPool:
    return bounded_pool.routed()


def fail_three(api: Client, agent: Agent) -> None:
    for i in range(3):
        turn = wait_turn(api, submit(api, agent.name, ("alice", f"message {i + 1}"))["id"])
        assert turn["status"] == "failed", turn
        wait_for(partial(streak_reached, agent, i + 1), what="the streak")


def couldnt_tell(api: Client, agent: Agent, probe_outcome: str, *, requests: Any = None) -> None:
    """The run settles with the probe's couldn't-tell alert, nothing shed and no retry."""
    alert = wait_for(
        lambda: Alert.objects.filter(kind="history-kept", agent=agent.name).first(),
        timeout=20,
        what="the history-kept alert",
    )
    assert alert.verdict == "unclear"
    assert "couldn't tell whether the history is the cause" in alert.message
    assert "no retry was queued" in alert.message
    [probe] = probes(agent)
    assert probe.outcome == probe_outcome
    assert probe_status(agent) in ("unclear", "aborted")
    nothing_shed(agent)
    # A retry would have been queued in the same transaction as the alert.
    assert Turn.objects.filter(agent=agent).count() == 3
    assert all(t.status == "failed" for t in Turn.objects.filter(agent=agent))
    assert HistoryRow.objects.filter(agent=agent, role="user", state="presented").count() == 3
    if requests is not None:
        assert len(requests()) == 4  # three turns and the probe: the probe was not retried


@pytest.mark.usefixtures("workers")
@pytest.mark.parametrize(
    ("probe_step", "why"),
    [
        ("rate-limit", "rate_limit, HTTP 429"),
        ("error:status=500", "server, HTTP 500"),
        ("error:status=404", "invalid_request, HTTP 404"),
    ],
)
def test_a_probe_that_fails_another_way_sheds_nothing_queues_no_retry_and_says_it_couldnt_tell(
    api: Client,
    standin_requests: Any,
    make_agent: Any,
    probe_step: str,
    why: str,
) -> None:
    agent = make_agent(model=sequence("refuse", "refuse", "refuse", probe_step, "refuse"))
    fail_three(api, agent)
    couldnt_tell(api, agent, "error", requests=standin_requests)
    assert why in Alert.objects.get(kind="history-kept", agent=agent.name).message


@pytest.mark.parametrize("probe_step", ["hang", "trickle:interval_ms=100"])
def test_a_probe_cut_by_its_bounds_sheds_nothing_and_says_it_couldnt_tell(
    api: Client,
    standin_requests: Any,
    make_agent: Any,
    bounded: WorkerPool,
    probe_step: str,
) -> None:
    agent = make_agent(
        model=sequence("refuse", "refuse", "refuse", probe_step, "refuse"), max_tokens=87
    )
    fail_three(api, agent)
    couldnt_tell(api, agent, "cut", requests=standin_requests)
    [probe] = probes(agent)
    assert probe.bound == "whole_call" and not probe.streamed


def test_a_warm_shutdown_aborts_the_probe_out_and_the_next_failure_probes_again(
    api: Client,
    standin_requests: Any,
    make_agent: Any,
    session_workers: WorkerPool,
) -> None:
    pool = WorkerPool(1, label="breaker-stopping")
    try:
        # The probe hangs: only the shutdown ends it (the whole-call bound is minutes away).
        agent = make_agent(model=sequence("refuse", "refuse", "refuse", "hang", "refuse"))
        fail_three(api, agent)
        probe_out(agent)
        stopped_at = time.monotonic()
        pool.procs[0].send_signal(signal.SIGTERM)
        pool.procs[0].wait(timeout=15)
        assert time.monotonic() - stopped_at < 10
    finally:
        pool.stop()
    couldnt_tell(api, agent, "aborted", requests=standin_requests)
    assert probe_status(agent) == "aborted"
    assert "the service is stopping" in BreakerState.objects.get(agent=agent).probe_verdict

    celery_app.conf.task_default_queue = session_workers.queue
    turn = wait_turn(api, submit(api, agent.name, ("alice", "message 4"))["id"])
    assert turn["status"] == "failed"
    wait_for(
        lambda: probes(agent).count() == 2 and probe_status(agent) == "refused",
        what="a second probe, refused",
    )
    nothing_shed(agent)


@pytest.mark.usefixtures("workers")
@pytest.mark.timeout(150)
def test_a_poisoned_row_is_still_shed_when_the_probe_is_answered_a_minute_later(
    api: Client, make_agent: Any
) -> None:
    # The default bounds give a non-streamed call minutes; the drain renews its lease meanwhile.
    agent = make_agent(
        model=sequence("poison", "poison", "poison", "answer:delay_ms=61000", "poison")
    )
    first = wait_turn(api, submit(api, agent.name, ("alice", "this carries POISON"))["id"])
    assert first["status"] == "failed"
    for i in (2, 3):
        turn = wait_turn(api, submit(api, agent.name, ("alice", f"message {i}"))["id"])
        assert turn["status"] == "failed"
        wait_for(partial(streak_reached, agent, i), what="the streak")
    probe_out(agent)
    wait_for(
        lambda: Turn.objects.filter(agent=agent, status="succeeded").exists(),
        timeout=100,
        what="a retry to succeed",
    )
    [probe] = probes(agent)
    assert probe.outcome == "completed"
    assert probe.ended_at is not None and probe.sent_at is not None
    assert (probe.ended_at - probe.sent_at).total_seconds() >= 60
    set_aside = HistoryRow.objects.filter(agent=agent, state="set_aside").order_by("seq")
    assert [r.content for r in set_aside] == ["this carries POISON", "message 2", "message 3"]
    assert BreakerState.objects.get(agent=agent).streak == 0
