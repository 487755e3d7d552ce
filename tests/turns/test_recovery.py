"""Nothing is lost when a worker dies mid-turn: its lease lapses and the turn runs again."""

from __future__ import annotations

import signal
import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import Client

from agentops.models import HistoryRow
from inference.models import AgentLease, InferenceCall, Turn
from interfaces.tasks import turns_sweep
from tests.conftest import LOG_DIR, WorkerPool, celery_app, wait_for
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_turn_left_running_by_a_killed_worker_is_resumed_by_another(
    api: Client, make_agent: Any, django_db_blocker: Any
) -> None:
    env = {"AGENTOPS_TURN_LEASE_MS": "1000"}
    doomed = WorkerPool(1, label="doomed", extra_env=env)
    try:
        agent = make_agent(model="answer:delay_ms=4000")
        turn_id = submit(api, agent.name, ("alice", "survive this"))["id"]
        wait_for(
            lambda: InferenceCall.objects.filter(agent=agent).exists(),
            what="the first call to start",
        )
        doomed.procs[0].send_signal(signal.SIGKILL)
        doomed.procs[0].wait(timeout=10)
    finally:
        doomed.stop()
    assert Turn.objects.get(pk=turn_id).status == "running"
    assert AgentLease.objects.filter(agent=agent).exists()  # nobody released it

    rescuer = WorkerPool(1, label="rescuer", extra_env=env)
    try:
        # The dead worker's lease is still live: a sweep now must not run the turn twice.
        turns_sweep.delay()
        # Lapsed, and past the grace in which a live owner would have renewed it.
        grace = timedelta(milliseconds=settings.AGENTOPS_TURN_LEASE_GRACE_MS)
        wait_for(
            lambda: AgentLease.objects.filter(agent=agent, until__lt=_now() - grace).exists(),
            timeout=5 + grace.total_seconds(),
            what="the lease to lapse",
        )
        turns_sweep.delay()
        turn = wait_turn(api, turn_id, {"succeeded", "failed"}, timeout=30)
    finally:
        rescuer.stop()
        celery_app.conf.task_default_queue = rescuer.previous_queue
    assert turn["status"] == "succeeded"
    assert HistoryRow.objects.filter(agent=agent, role="assistant").count() == 1
    lost, retried = InferenceCall.objects.filter(agent=agent).order_by("id")
    assert (
        lost.outcome == "aborted"
        and lost.error is not None
        and lost.error["message"].startswith("the worker making this call stopped")
    )
    # What the lost call used is unknown: no cost, never 0 (architecture.md §17).
    assert (lost.cost, lost.cost_basis) == (None, "usage unreported")
    assert retried.outcome == "completed"
    # One line at WARNING, in the worker that took over, names the turn and both workers (with
    # telemetry off too: these workers export nothing).
    log = (LOG_DIR / f"{rescuer.names[0].split('@')[0]}.log").read_text()
    [line] = [line for line in log.splitlines() if f"turn {turn_id} taken over" in line]
    assert " WARNING " in line and f"{rescuer.names[0]}:" in line and f"{doomed.names[0]}:" in line


def _now() -> Any:
    from django.utils import timezone

    return timezone.now()


def test_a_warm_shutdown_hands_a_turn_waiting_to_retry_back_without_a_call(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    pool = WorkerPool(1, label="stopping")
    try:
        # A 429 stating no wait: the service's own pacing waits 60 s or more before calling again.
        agent = make_agent(model="error:status=429,times=1")
        turn_id = submit(api, agent.name, ("alice", "hi"))["id"]
        wait_for(
            lambda: InferenceCall.objects.filter(agent=agent, outcome="error").exists(),
            what="the first call to fail",
        )
        pool.procs[0].send_signal(signal.SIGTERM)
        pool.procs[0].wait(timeout=10)  # the retry wait ends at once: no 60 s sleep, no call
    finally:
        pool.stop()
        celery_app.conf.task_default_queue = pool.previous_queue
    assert Turn.objects.get(pk=turn_id).status == "queued"
    assert len(standin_requests()) == 1
    assert not AgentLease.objects.filter(agent=agent).exists()


def test_a_warm_shutdown_waits_for_a_call_that_is_out_and_stores_its_answer(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    pool = WorkerPool(1, label="finishing")
    try:
        agent = make_agent(model="answer:delay_ms=2500")
        turn_id = submit(api, agent.name, ("alice", "finish this"))["id"]
        wait_for(standin_requests, what="the call to reach the provider")
        sent = time.time()
        pool.procs[0].send_signal(signal.SIGTERM)
        pool.procs[0].wait(timeout=20)
        exited = time.time()
    finally:
        pool.stop()
        celery_app.conf.task_default_queue = pool.previous_queue
    # The worker stayed until the call ended and its turn was recorded, then went.
    assert Turn.objects.get(pk=turn_id).status == "succeeded"
    assert HistoryRow.objects.filter(agent=agent, role="assistant").count() == 1
    (call,) = InferenceCall.objects.filter(agent=agent)
    assert call.outcome == "completed"
    assert exited - sent >= 2.0
    assert pool.procs[0].returncode == 0
    assert not AgentLease.objects.filter(agent=agent).exists()


def test_a_call_whose_lease_another_worker_took_is_aborted_at_the_renewers_next_round(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    pool = WorkerPool(
        1, label="overtaken", extra_env={"AGENTOPS_TURN_LEASE_MS": "1000"}
    )  # a round every 250 ms
    try:
        agent = make_agent(model="endless:interval_ms=50")
        turn_id = submit(api, agent.name, ("alice", "go on forever"))["id"]
        wait_for(standin_requests, what="the call to reach the provider")
        AgentLease.objects.filter(agent=agent).update(owner="another-worker")  # as after a takeover
        taken = time.time()
        call = wait_for(
            lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).first(),
            timeout=10,
            what="the call to end",
        )
    finally:
        pool.stop()
        celery_app.conf.task_default_queue = pool.previous_queue
    assert call.outcome == "aborted" and call.ended_at is not None
    assert call.ended_at.timestamp() - taken < 1.0  # within a round (250 ms) and the abort
    # The run stopped without touching what is now the other owner's: the turn and its lease.
    assert Turn.objects.get(pk=turn_id).status == "running"
    assert AgentLease.objects.get(agent=agent).owner == "another-worker"
    assert InferenceCall.objects.filter(agent=agent).count() == 1
    Turn.objects.filter(pk=turn_id).update(status="cancelled")
    AgentLease.objects.all().delete()
