"""The alert service (architecture.md §8): every caller raises alerts through ``alert_raise``.

Raising one stores the alert row and queues its webhook deliveries (the outbox) in one
transaction, then, once committed, writes the failures.log line, broadcasts it to the live
dashboard and sends the delivery tasks. The message and ``data`` are bounded once, here, so the
row, the log line, the dashboard event and the webhook body all carry the same bounded values.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentops.webhooks.services import webhook_deliveries_queue

from .exceptions import Conflict, NotFound
from .failures import failures_log_write
from .live import dashboard_publish
from .models import Alert, AuditEntry
from .selectors import alert_json
from .text import PROVIDER_CODE_LIMIT, bound_data, bound_text

logger = logging.getLogger(__name__)


def alert_raise(
    *,
    kind: str,
    agent: str,
    message: str,
    model: str = "",
    verdict: str = "",
    data: dict[str, Any] | None = None,
) -> Alert:
    """Record an alert. Safe inside a transaction: the log line, broadcast and webhook tasks
    happen on commit; the alert row and its deliveries are written together or not at all."""
    with transaction.atomic():
        alert = Alert.objects.create(
            kind=kind[:50],
            agent=agent[:100],
            model=bound_text(model, PROVIDER_CODE_LIMIT)[:200],
            verdict=verdict[:50],
            message=bound_text(message),
            data=bound_data(data or {}),
        )
        webhook_deliveries_queue(alert=alert, now=timezone.now())
    logger.warning(
        "alert %s for agent %s model %s: %s", kind, agent, model or "-", alert.message[:500]
    )

    def after_commit() -> None:
        failures_log_write(
            kind=alert.kind,
            agent=alert.agent,
            model=alert.model,
            verdict=alert.verdict,
            message=alert.message,
            alert=alert.pk,
            data=alert.data,
        )
        dashboard_publish({"type": "alert.raised", "alert": alert_json(alert)})

    transaction.on_commit(after_commit)
    return alert


def alert_acknowledge(*, alert_id: int, actor: str, now: datetime) -> Alert:
    """Acknowledge an alert once, with its audit entry. Raises NotFound for an unknown id and
    Conflict if it was already acknowledged (by anyone, through any interface).

    The conditional update makes concurrent acknowledgements safe: exactly one changes the row."""
    with transaction.atomic():
        changed = Alert.objects.filter(pk=alert_id, acknowledged_at__isnull=True).update(
            acknowledged_at=now, acknowledged_by=actor
        )
        alert = Alert.objects.filter(pk=alert_id).first()
        if alert is None:
            raise NotFound(f"alert_id: no alert with id {alert_id}", data={"field": "alert_id"})
        if not changed:
            assert alert.acknowledged_at is not None
            raise Conflict(
                f"alert {alert_id} was already acknowledged by "
                f"{alert.acknowledged_by or 'someone'} at {alert.acknowledged_at.isoformat()}",
                data={
                    "acknowledged_at": alert.acknowledged_at,
                    "acknowledged_by": alert.acknowledged_by,
                },
            )
        AuditEntry.objects.create(
            actor=actor,
            action="alert.acknowledge",
            target=f"alert:{alert_id}",
            data={
                "kind": alert.kind,
                "agent": alert.agent,
                "model": alert.model,
                "verdict": alert.verdict,
            },
        )
    return alert
