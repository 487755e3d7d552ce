"""A held turn keeps one scheduled re-check, however often its agent is drained meanwhile.

Every drain of a held turn re-checks it (the beat sweep's every 15 s, a release's, a duplicate
delivery's). When each scheduled a re-check of its own, and each re-check the next, every sweep
started one more chain: a two-hour hold drained its agent several times a second by the end."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client

from agentops.celery import app as celery_app
from agentops.models import Agent
from inference.models import Turn
from inference.tasks import agent_drain
from tests.conftest import WorkerPool, wait_for, worker_pool

RECHECK_MS = 2000


@pytest.fixture(scope="module")
def recheck_pool(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(1, label="recheck", extra_env={"AGENTOPS_WAIT_RECHECK_MS": str(RECHECK_MS)})


def _scheduled_drains(pool: WorkerPool, agent_id: int) -> int:
    """The agent's drains the pool's worker holds with a countdown (Celery's ``scheduled``)."""
    found = celery_app.control.inspect(destination=pool.names, timeout=2).scheduled() or {}
    return sum(
        1 for entries in found.values() for entry in entries
        if entry["request"]["name"] == "inference.tasks.agent_drain" and list(entry["request"]["args"]) == [agent_id]
    )


@pytest.mark.django_db(transaction=True)
def test_drains_of_a_held_turn_do_not_multiply_its_rechecks(
    recheck_pool: WorkerPool, make_agent: Callable[..., Agent], api: Client,
) -> None:
    recheck_pool.routed()
    agent = make_agent(model="error:status=429,form=retry-after,wait_ms=600000,times=1")
    submitted = api.post(f"/api/v1/agents/{agent.name}/turns", {"messages": [{"participant": "alice", "content": "Hi"}]}, content_type="application/json")
    assert submitted.status_code == 202, submitted.content
    turn_id = submitted.json()["id"]
    wait_for(lambda: Turn.objects.filter(pk=turn_id, status=Turn.Status.HELD).exists(), what="the turn to be held")
    # Six more drains, as six sweeps would send them, each its own run (apart in time).
    for _ in range(6):
        agent_drain.delay(agent.pk)
        time.sleep(0.3)
    time.sleep(RECHECK_MS / 1000)
    counts = []
    for _ in range(5):
        counts.append(_scheduled_drains(recheck_pool, agent.pk))
        time.sleep(0.5)
    assert Turn.objects.get(pk=turn_id).status == Turn.Status.HELD
    assert 1 <= max(counts) <= 2, f"scheduled re-checks of the held agent, sampled every 0.5 s: {counts}"
    assert api.post(f"/api/v1/turns/{turn_id}/cancel").status_code == 200
