"""The alert service (DESIGN §8): every caller raises alerts through ``alert_raise``.

Raising one writes the failures.log line, stores the alert row and broadcasts it to the live
dashboard once committed. (Webhook deliveries hang off the same call: see issue 6.)
"""

from __future__ import annotations

import logging
from typing import Any

from channels.layers import get_channel_layer
from django.db import transaction

from .background import background_loop
from .failures import failures_log_write
from .models import Alert
from .text import PROVIDER_CODE_LIMIT, bound_text

logger = logging.getLogger(__name__)

DASHBOARD_GROUP = "dashboard"


def alert_raise(
    *, kind: str, agent: str, message: str, model: str = "", verdict: str = "", data: dict[str, Any] | None = None
) -> Alert:
    """Record an alert. Safe inside a transaction: the log line and broadcast happen on commit."""
    alert = Alert.objects.create(
        kind=kind[:50],
        agent=agent[:100],
        model=bound_text(model, PROVIDER_CODE_LIMIT)[:200],
        verdict=verdict[:50],
        message=bound_text(message),
        data=data or {},
    )
    logger.warning("alert %s for agent %s model %s: %s", kind, agent, model or "-", alert.message[:500])

    def after_commit() -> None:
        failures_log_write(kind=kind, agent=agent, model=model, verdict=verdict, message=alert.message, alert=alert.pk, data=data or {})
        _broadcast(alert)

    transaction.on_commit(after_commit)
    return alert


def alert_out(alert: Alert) -> dict[str, Any]:
    return {
        "id": alert.pk,
        "kind": alert.kind,
        "agent": alert.agent,
        "model": alert.model,
        "verdict": alert.verdict or None,
        "message": alert.message,
        "data": alert.data,
        "created_at": alert.created_at,
        "acknowledged_at": alert.acknowledged_at,
    }


def _broadcast(alert: Alert) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    payload = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in alert_out(alert).items()}
    message = {"type": "dashboard.event", "event": {"type": "alert.raised", "alert": payload}}

    async def send() -> None:
        try:
            await layer.group_send(DASHBOARD_GROUP, message)
        except Exception:  # the dashboard is best effort; the row is the record
            logger.warning("could not broadcast alert %s", alert.pk, exc_info=True)

    background_loop().send_in_order(send())
