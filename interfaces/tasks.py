"""Celery tasks: thin interfaces over the drain (``turns.drain``) and the webhook services. They
take ids and are safe to deliver twice (a webhook attempt is claimed by a conditional update).

Their registered names are the ones they had before the files moved (``interfaces.tasks.*``,
``webhooks.tasks.*``): messages already in a broker, and beat's schedule, still find them."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from agentops.idempotency import idempotency_keys_sweep
from agentops.webhooks.selectors import deliveries_due
from agentops.webhooks.services import webhook_deliveries_enqueue, webhook_delivery_attempt
from inference.models import Turn
from turns import drain

SWEEP_BATCH = 500


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
    agent_ids = set(
        Turn.objects.filter(status__in=open_statuses).values_list("agent_id", flat=True)
    )
    for agent_id in agent_ids:
        agent_drain.delay(agent_id)
    return len(agent_ids)


@shared_task(name="webhooks.tasks.webhook_deliver")
def webhook_deliver(delivery_id: int) -> str | None:
    return webhook_delivery_attempt(delivery_id=delivery_id)


@shared_task(name="webhooks.tasks.webhooks_sweep")
def webhooks_sweep() -> int:
    """Beat's safety net: a task for every pending delivery that is due (its task was lost,
    its countdown cut at the broker's limit, or its worker died mid-attempt)."""
    due = deliveries_due(now=timezone.now(), limit=SWEEP_BATCH)
    webhook_deliveries_enqueue(delivery_ids=due)
    return len(due)


@shared_task(name="interfaces.tasks.idempotency_sweep")
def idempotency_sweep() -> int:
    """Beat's deletion of the Idempotency-Key records past their TTL (a repeat after it is a new
    request anyway: the claim replaces an expired key)."""
    return idempotency_keys_sweep(now=timezone.now())
