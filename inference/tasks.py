"""Celery tasks: thin interfaces over the drain (``inference.turns.drain``). They take ids and are safe to deliver twice."""

from __future__ import annotations

from celery import shared_task

from .models import Turn
from .turns import drain


@shared_task(name="inference.tasks.agent_drain", acks_late=True)
def agent_drain(agent_id: int) -> None:
    drain.agent_drain(agent_id)


@shared_task(name="inference.tasks.turns_sweep")
def turns_sweep() -> int:
    """Enqueue a drain for every agent with a queued, running or held turn: the safety net for
    a lost message or a dead worker (its lease lapses), and the re-check of held turns whose
    wait is "until released" or whose records were unreadable. A drain that finds the agent's
    lease held returns at once."""
    open_statuses = [Turn.Status.QUEUED, Turn.Status.RUNNING, Turn.Status.HELD]
    agent_ids = set(Turn.objects.filter(status__in=open_statuses).values_list("agent_id", flat=True))
    for agent_id in agent_ids:
        agent_drain.delay(agent_id)
    return len(agent_ids)
