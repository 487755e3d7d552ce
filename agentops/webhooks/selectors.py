"""Reads for webhooks."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q, QuerySet

from .models import WebhookDelivery, WebhookEndpoint


def endpoints_for_kind(kind: str) -> QuerySet[WebhookEndpoint]:
    """Enabled endpoints that receive alerts of ``kind`` (an empty kinds list receives all)."""
    return (
        WebhookEndpoint.objects.filter(enabled=True)
        .filter(Q(kinds=[]) | Q(kinds__contains=[kind]))
        .order_by("id")
    )


def deliveries_due(*, now: datetime, limit: int) -> list[int]:
    """Pending deliveries whose next attempt is due, oldest first: those whose task was lost,
    whose countdown was cut short, or whose worker died mid-attempt (its claim lapsed)."""
    return list(
        WebhookDelivery.objects.filter(
            status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=now
        )
        .order_by("next_attempt_at")
        .values_list("id", flat=True)[:limit]
    )
