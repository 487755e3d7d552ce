"""A turn says why it waits (issue 13, item 3): after a release that falls back to the 429's
pacing, ``GET /turns/{id}`` shows ``waiting_until`` and ``waiting_reason``, and the release's
receipt says when the next call may go (``next_call_at``). And a held turn keeps one scheduled
re-check, however often its agent is drained meanwhile."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client, override_settings

from agentops.celery import app as celery_app
from agentops.models import Agent
from inference.models import InferenceCall, Turn
from interfaces.tasks import agent_drain
from tests.conftest import WorkerPool, wait_for, worker_pool

FLOOR_S = 20.0
RECHECK_MS = 1000


@pytest.fixture(scope="module")
def pacing_pool(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(
        1,
        label="pace",
        extra_env={
            "AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS": str(int(FLOOR_S * 1000)),
            "AGENTOPS_WAIT_RECHECK_MS": str(RECHECK_MS),
        },
    )


def _held_turn(api: Client, agent: Agent) -> int:
    """Submit a turn to an agent whose provider answers 429 with a long Retry-After; its id,
    once the turn is held."""
    submitted = api.post(
        f"/api/v1/agents/{agent.name}/turns",
        {"messages": [{"participant": "alice", "content": "Hi"}]},
        content_type="application/json",
    )
    assert submitted.status_code == 202, submitted.content
    turn_id: int = submitted.json()["id"]
    wait_for(
        lambda: Turn.objects.filter(pk=turn_id, status=Turn.Status.HELD).exists(),
        what="the turn to be held",
    )
    return turn_id


@pytest.mark.django_db(transaction=True)
@override_settings(
    AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS=FLOOR_S * 1000
)  # as the worker runs (one config in production)
def test_after_a_release_the_turn_shows_it_waits_for_the_429_pacing_and_the_receipt_says_until_when(
    pacing_pool: WorkerPool,
    make_agent: Callable[..., Agent],
    api: Client,
) -> None:
    pacing_pool.routed()
    agent = make_agent(model="error:status=429,form=retry-after,wait_ms=600000,times=1")
    turn_id = _held_turn(api, agent)
    before = api.get(f"/api/v1/turns/{turn_id}").json()
    assert (
        before["waiting_until"] is None and before["waiting_reason"] is None
    )  # held: the hold says why
    ended = InferenceCall.objects.get(turn_id=turn_id).ended_at
    assert ended is not None
    pacing_end = ended + timedelta(seconds=FLOOR_S)

    released = api.post(
        "/api/v1/waits/release",
        {"agent": agent.name, "reason": "test"},
        content_type="application/json",
    )
    assert released.status_code == 200, released.content
    (receipt,) = released.json()["receipts"]
    assert abs((datetime.fromisoformat(receipt["next_call_at"]) - pacing_end).total_seconds()) < 1.0

    def waiting() -> dict[str, Any] | None:
        body: dict[str, Any] = api.get(f"/api/v1/turns/{turn_id}").json()
        return body if body["waiting_until"] else None

    seen = wait_for(waiting, timeout=10, what="the turn to say it waits")
    assert seen["status"] == "running"
    assert seen["waiting_reason"] == "pacing after a 429"
    assert abs((datetime.fromisoformat(seen["waiting_until"]) - pacing_end).total_seconds()) < 1.0
    assert api.post(f"/api/v1/turns/{turn_id}/cancel").status_code == 200


def _scheduled_drains(pool: WorkerPool, agent_id: int) -> int:
    """The agent's drains the pool's worker holds with a countdown (Celery's ``scheduled``)."""
    found = celery_app.control.inspect(destination=pool.names, timeout=2).scheduled() or {}
    return sum(
        1
        for entries in found.values()
        for entry in entries
        if entry["request"]["name"] == "inference.tasks.agent_drain"
        and list(entry["request"]["args"]) == [agent_id]
    )


def _rechecked(turn_id: int) -> None:
    """Return once the held turn has been re-checked again: a re-check writes its hold again
    (with the same values), a new version of its row."""

    def version() -> str:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT xmin::text FROM {Turn._meta.db_table} WHERE id = %s", [turn_id])
            row = cursor.fetchone()
        assert row is not None
        return str(row[0])

    before = version()
    wait_for(lambda: version() != before, timeout=10, what="the held turn's next re-check")


@pytest.mark.django_db(transaction=True)
def test_drains_of_a_held_turn_do_not_multiply_its_rechecks(
    pacing_pool: WorkerPool,
    make_agent: Callable[..., Agent],
    api: Client,
) -> None:
    """Every drain of a held turn re-checks it (the beat sweep's every 15 s, a release's, a
    duplicate delivery's). When each scheduled a re-check of its own, and each re-check the
    next, every sweep started one more chain: a two-hour hold drained its agent several times
    a second by the end."""
    pacing_pool.routed()
    agent = make_agent(model="error:status=429,form=retry-after,wait_ms=600000,times=1")
    turn_id = _held_turn(api, agent)
    # Six more drains, as six sweeps would send them, each its own run (apart in time).
    for _ in range(6):
        agent_drain.delay(agent.pk)
        time.sleep(0.3)  # apart in time, as sweeps send them: each drain is a run of its own
    # The worker has run the six drains once a turn submitted after them has run.
    probe = make_agent(model="answer")
    probe_id = api.post(
        f"/api/v1/agents/{probe.name}/turns",
        {"messages": [{"participant": "alice", "content": "Hi"}]},
        content_type="application/json",
    ).json()["id"]
    wait_for(
        lambda: Turn.objects.filter(pk=probe_id, status=Turn.Status.SUCCEEDED).exists(),
        what="a turn submitted after the drains to run",
    )
    counts = []
    for _ in range(5):
        # Sampled after each of five re-checks: a chain per drain would show. (The count at an
        # instant is what is measured: no event marks a chain starting.)
        _rechecked(turn_id)
        counts.append(_scheduled_drains(pacing_pool, agent.pk))
    assert Turn.objects.get(pk=turn_id).status == Turn.Status.HELD
    assert 1 <= max(counts) <= 2, (
        f"scheduled re-checks of the held agent, sampled after each re-check: {counts}"
    )
    assert api.post(f"/api/v1/turns/{turn_id}/cancel").status_code == 200
