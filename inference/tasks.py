"""Celery tasks: thin interfaces over the runner. They take ids and are safe to deliver twice."""

from __future__ import annotations

from celery import shared_task

from . import runner
from .models import Turn


@shared_task(name="inference.tasks.agent_drain", acks_late=True)
def agent_drain(agent_id: int) -> None:
    runner.agent_drain(agent_id)


@shared_task(name="inference.tasks.turns_sweep")
def turns_sweep() -> int:
    """Safety net: enqueue a drain for every agent with a queued turn (a lost message, a worker
    that died). A drain that finds the agent's lock taken returns at once."""
    agent_ids = set(Turn.objects.filter(status__in=[Turn.Status.QUEUED, Turn.Status.RUNNING]).values_list("agent_id", flat=True))
    for agent_id in agent_ids:
        agent_drain.delay(agent_id)
    return len(agent_ids)
