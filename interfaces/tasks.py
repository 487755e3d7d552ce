"""Celery tasks: thin interfaces over the drain (``turns.drain``) and the webhook services. They
take ids and are safe to deliver twice (a webhook attempt is claimed by a conditional update).

Their registered names are the ones they had before the files moved (``interfaces.tasks.*``,
``webhooks.tasks.*``): messages already in a broker, and beat's schedule, still find them."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from agentops.idempotency import idempotency_keys_sweep
from agentops.runtime import NoRuntime
from agentops.webhooks.selectors import deliveries_due
from agentops.webhooks.services import webhook_deliveries_enqueue, webhook_delivery_attempt
from calls.health import provider_down_check as provider_down_check_at
from inference.models import Turn
from interfaces import worker  # noqa: F401  (the worker's runtime, built with the worker)
from turns import drain
from turns.runtime import running

SWEEP_BATCH = 500


@shared_task(name="inference.tasks.agent_drain", acks_late=True)
def agent_drain(agent_id: int) -> None:
    # A task is handed only its ids: the worker's runtime is the one its worker_init built.
    rt = running()
    if not isinstance(rt, drain.WorkerRuntime):
        raise NoRuntime("agent_drain runs in a worker, whose runtime has run slots")
    drain.agent_drain(rt, agent_id)


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
    return webhook_delivery_attempt(running(), delivery_id=delivery_id)


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


@shared_task(name="calls.tasks.provider_down_check")
def provider_down_check(provider_id: int, window_ms: int) -> bool:
    return provider_down_check_at(provider_id=provider_id, window_ms=window_ms)
