"""Celery tasks for webhooks: thin interfaces over the services. They take ids and are safe to
deliver twice (an attempt is claimed by a conditional update)."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from .selectors import deliveries_due
from .services import webhook_deliveries_enqueue, webhook_delivery_attempt

SWEEP_BATCH = 500


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
