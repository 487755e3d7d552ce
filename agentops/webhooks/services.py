"""Webhook services (architecture.md §8): queue deliveries in the alert's transaction, make
attempts, resend.

The life of a delivery: ``pending`` (next attempt due at ``next_attempt_at``) until an attempt
ends it as ``delivered``, ``failed`` (refused for good) or ``gave_up`` (attempts ran out). A
worker claims an attempt with a conditional update that moves ``next_attempt_at`` past the
attempt's longest run, so any number of workers, the retry countdown and the sweep may all try
the same delivery and exactly one attempt runs; if that worker dies, the claim lapses and the
sweep tries again.
"""

from __future__ import annotations

import json
import logging
import random
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from agentops.celery import task_send
from agentops.exceptions import Conflict, NotFound
from agentops.models import Alert, AuditEntry
from agentops.runtime import Runtime
from agentops.text import bound_text
from agentops.urlsafety import HostUnresolved, url_for_log, url_vet

from .models import WebhookAttempt, WebhookCooldown, WebhookDelivery, WebhookEndpoint
from .retry import Next, Verdict, attempt_verdict
from .selectors import endpoints_for_kind
from .sender import Answer, post_signed
from .signing import signature

logger = logging.getLogger(__name__)

EVENT_TYPE = "alert.raised"
WEBHOOK_DELIVER = "webhooks.tasks.webhook_deliver"  # interfaces.tasks, sent by name
_OUTCOMES = {
    Next.DELIVERED: WebhookAttempt.Outcome.DELIVERED,
    Next.RETRY: WebhookAttempt.Outcome.RETRY,
    Next.FAIL: WebhookAttempt.Outcome.FAILED,
    Next.DISABLE: WebhookAttempt.Outcome.FAILED,
    Next.GIVE_UP: WebhookAttempt.Outcome.GAVE_UP,
}
_STATUSES = {
    Next.DELIVERED: WebhookDelivery.Status.DELIVERED,
    Next.FAIL: WebhookDelivery.Status.FAILED,
    Next.DISABLE: WebhookDelivery.Status.FAILED,
    Next.GIVE_UP: WebhookDelivery.Status.GAVE_UP,
}


# --- queueing (the outbox) -------------------------------------------------------------------


def webhook_deliveries_queue(*, alert: Alert, now: datetime) -> list[int]:
    """Queue a delivery of ``alert`` to each enabled endpoint that receives its kind, unless the
    endpoint had one queued for the same (agent, kind, verdict) within the cooldown. Call it in
    the alert's own transaction: the deliveries exist if and only if the alert does. The tasks
    are sent once that transaction commits. Returns the new deliveries' ids."""
    cutoff = now - timedelta(milliseconds=settings.AGENTOPS_ALERT_WEBHOOK_COOLDOWN_MS)
    body: str | None = None
    queued: list[int] = []
    with transaction.atomic():
        for endpoint in endpoints_for_kind(alert.kind):
            if not _cooldown_claim(endpoint_id=endpoint.pk, alert=alert, now=now, cutoff=cutoff):
                continue
            body = body or alert_payload(alert)
            delivery = WebhookDelivery.objects.create(
                endpoint=endpoint, alert=alert, payload=body, next_attempt_at=now
            )
            queued.append(delivery.pk)
    if queued:
        transaction.on_commit(lambda: _enqueue(queued))
    return queued


def _cooldown_claim(*, endpoint_id: int, alert: Alert, now: datetime, cutoff: datetime) -> bool:
    """Take the key's cooldown slot if it is free (never queued, or last queued before
    ``cutoff``). One statement: concurrent raisers of the same key block on the row until the
    first commits, then see its time, so exactly one of them queues."""
    table = WebhookCooldown._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO {table} (endpoint_id, agent, kind, verdict, last_queued_at)
            VALUES (%s, %s, %s, %s, %s)
            ON CONFLICT (endpoint_id, agent, kind, verdict)
            DO UPDATE SET last_queued_at = EXCLUDED.last_queued_at
            WHERE {table}.last_queued_at <= %s
            RETURNING id
            """,
            [endpoint_id, alert.agent, alert.kind, alert.verdict, now, cutoff],
        )
        return cursor.fetchone() is not None


def alert_payload(alert: Alert) -> str:
    """The body every attempt of a delivery sends, byte for byte (it is what is signed): the
    alert as the dashboard shows it (``agentops.selectors.alert_json``), less its
    acknowledgement, which a delivery queued with the alert cannot know."""
    from agentops.selectors import alert_json

    fields = alert_json(alert)
    del fields["acknowledged_at"]
    return json.dumps(
        {"type": EVENT_TYPE, "timestamp": fields["created_at"], "data": fields},
        ensure_ascii=False,
        separators=(",", ":"),
        default=str,
    )


def _enqueue(delivery_ids: list[int], *, countdown_s: float = 0.0) -> None:
    # A countdown cut short is fine: the row's next_attempt_at and the sweep cover the rest.
    for delivery_id in delivery_ids:
        task_send(WEBHOOK_DELIVER, delivery_id, countdown_s=countdown_s)


def webhook_deliveries_enqueue(*, delivery_ids: list[int]) -> None:
    """Send a task for each delivery now (the sweep's way to recover lost tasks)."""
    _enqueue(delivery_ids)


# --- attempts --------------------------------------------------------------------------------


def webhook_delivery_attempt(rt: Runtime, *, delivery_id: int) -> str | None:
    """Make the next attempt of a delivery if it is pending, due, and this caller claims it,
    sent on the loop of ``rt``, the process's runtime.
    Returns the delivery's status after the attempt, or None if there was nothing to do (not
    due, finished, or claimed by someone else): a duplicate task is harmless."""
    claim = _attempt_claim(delivery_id=delivery_id)
    if claim is None:
        return None
    delivery, attempt = claim
    endpoint = delivery.endpoint
    if not endpoint.enabled:
        reason = (
            f"not sent: the endpoint is disabled ({endpoint.disabled_reason or 'by an operator'})"
        )
        return _attempt_refused(delivery=delivery, attempt=attempt, reason=reason)
    try:
        # Resolved once: the request goes to the addresses checked here, never to a second answer.
        vetted = url_vet(endpoint.url, allow_private=settings.AGENTOPS_WEBHOOKS_ALLOW_PRIVATE)
    except HostUnresolved as exc:  # DNS may be back by the next attempt
        answer = Answer(
            status_code=None,
            retry_after=None,
            excerpt="",
            error=bound_text(str(exc), 500),
            duration_ms=0.0,
        )
    else:
        if vetted.refusal:
            return _attempt_refused(
                delivery=delivery, attempt=attempt, reason=f"not sent: {vetted.refusal}"
            )
        try:
            headers = signed_headers(delivery=delivery, secret=endpoint.secret, now=timezone.now())
        except ValueError as exc:
            return _attempt_refused(
                delivery=delivery,
                attempt=attempt,
                reason=f"not sent: the endpoint's secret does not decode ({exc})",
            )
        answer = post_signed(
            rt,
            url=endpoint.url,
            addresses=vetted.addresses,
            headers=headers,
            body=delivery.payload.encode(),
            timeout_s=settings.AGENTOPS_WEBHOOK_TIMEOUT_MS / 1000,
        )
    now = timezone.now()
    verdict = attempt_verdict(
        status_code=answer.status_code,
        error=answer.error,
        retry_after=answer.retry_after,
        attempt=delivery.cycle_attempts,
        max_attempts=settings.AGENTOPS_WEBHOOK_MAX_ATTEMPTS,
        base_ms=settings.AGENTOPS_WEBHOOK_RETRY_BASE_MS,
        max_ms=settings.AGENTOPS_WEBHOOK_RETRY_MAX_MS,
        jitter=random.random(),
        now=now,
    )
    return _attempt_record(
        delivery=delivery, attempt=attempt, answer=answer, verdict=verdict, now=now
    )


def signed_headers(*, delivery: WebhookDelivery, secret: str, now: datetime) -> dict[str, str]:
    """Standard Webhooks headers for one attempt: the id is the delivery's, the timestamp and
    signature are this attempt's. Raises ValueError if the secret does not decode."""
    timestamp = int(now.timestamp())
    return {
        "content-type": "application/json",
        "webhook-id": delivery.webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(
            secret=secret,
            message_id=delivery.webhook_id,
            timestamp=timestamp,
            body=delivery.payload,
        ),
    }


def _attempt_claim(*, delivery_id: int) -> tuple[WebhookDelivery, WebhookAttempt] | None:
    now = timezone.now()
    # Longer than an attempt can run (DNS, then the timeout for connect and for the answer).
    lapses = now + timedelta(milliseconds=2 * settings.AGENTOPS_WEBHOOK_TIMEOUT_MS + 30_000)
    with transaction.atomic():
        claimed = WebhookDelivery.objects.filter(
            pk=delivery_id, status=WebhookDelivery.Status.PENDING, next_attempt_at__lte=now
        ).update(
            next_attempt_at=lapses,
            attempts=F("attempts") + 1,
            cycle_attempts=F("cycle_attempts") + 1,
            updated_at=now,
        )
        if not claimed:
            return None
        delivery = WebhookDelivery.objects.select_related("endpoint").get(pk=delivery_id)
        # The attempt row before the request: a crash mid-request still leaves its record.
        attempt = WebhookAttempt.objects.create(
            delivery=delivery, number=delivery.attempts, started_at=now
        )
    return delivery, attempt


def _attempt_refused(
    *, delivery: WebhookDelivery, attempt: WebhookAttempt, reason: str
) -> str | None:
    now = timezone.now()
    with transaction.atomic():
        WebhookAttempt.objects.filter(pk=attempt.pk).update(
            ended_at=now,
            outcome=WebhookAttempt.Outcome.REFUSED,
            duration_ms=0.0,
            error=bound_text(reason, 1000),
        )
        changed = WebhookDelivery.objects.filter(
            pk=delivery.pk, status=WebhookDelivery.Status.PENDING, attempts=attempt.number
        ).update(
            status=WebhookDelivery.Status.FAILED,
            next_attempt_at=None,
            finished_at=now,
            updated_at=now,
            last_error=bound_text(reason, 1000),
        )
    logger.warning(
        "webhook %s for alert %s to endpoint %s (%s): %s. "
        "Fix or re-enable the endpoint in the admin, then resend.",
        delivery.webhook_id,
        delivery.alert_id,
        delivery.endpoint_id,
        url_for_log(delivery.endpoint.url),
        reason,
    )
    return WebhookDelivery.Status.FAILED if changed else None


def _attempt_record(
    *,
    delivery: WebhookDelivery,
    attempt: WebhookAttempt,
    answer: Answer,
    verdict: Verdict,
    now: datetime,
) -> str | None:
    detail = answer.error or answer.excerpt
    last_error = (
        ""
        if verdict.next is Next.DELIVERED
        else bound_text(f"{verdict.reason}: {detail}" if detail else verdict.reason, 1000)
    )
    fields: dict[str, Any] = {"updated_at": now, "last_error": last_error}
    if verdict.next is Next.RETRY:
        assert verdict.delay_ms is not None
        fields.update(next_attempt_at=now + timedelta(milliseconds=verdict.delay_ms))
        status: str = WebhookDelivery.Status.PENDING
    else:
        status = _STATUSES[verdict.next]
        fields.update(status=status, next_attempt_at=None, finished_at=now)
    with transaction.atomic():
        WebhookAttempt.objects.filter(pk=attempt.pk).update(
            ended_at=now,
            outcome=_OUTCOMES[verdict.next],
            status_code=answer.status_code,
            duration_ms=answer.duration_ms,
            response_excerpt=answer.excerpt,
            error=answer.error,
        )
        # Only the holder of this attempt's claim writes the outcome: if the claim lapsed and
        # another attempt started meanwhile, that attempt's outcome is the one that counts.
        changed = WebhookDelivery.objects.filter(
            pk=delivery.pk, status=WebhookDelivery.Status.PENDING, attempts=attempt.number
        ).update(**fields)
        if verdict.next is Next.DISABLE:
            WebhookEndpoint.objects.filter(pk=delivery.endpoint_id, enabled=True).update(
                enabled=False,
                disabled_at=now,
                disabled_reason=bound_text(f"webhook {delivery.webhook_id}: {verdict.reason}", 500),
            )
        if changed and verdict.next is Next.RETRY:
            assert verdict.delay_ms is not None
            delay_s = verdict.delay_ms / 1000
            transaction.on_commit(lambda: _enqueue([delivery.pk], countdown_s=delay_s))
    if verdict.next is not Next.DELIVERED:
        logger.warning(
            "webhook %s for alert %s to %s: attempt %d: %s%s",
            delivery.webhook_id,
            delivery.alert_id,
            url_for_log(delivery.endpoint.url),
            attempt.number,
            verdict.reason,
            f" ({bound_text(detail, 300)})" if detail else "",
        )
    return status if changed else None


# --- resend ----------------------------------------------------------------------------------


def webhook_delivery_resend(*, delivery_id: int, actor: str, now: datetime) -> WebhookDelivery:
    """Send a finished delivery again: a fresh cycle of attempts with the same ``webhook-id``
    and body (receivers deduplicate on the id), audited. Raises NotFound for an unknown id and
    Conflict if it is still pending or its endpoint is disabled."""
    with transaction.atomic():
        delivery = (
            WebhookDelivery.objects.select_for_update(of=("self",))
            .select_related("endpoint")
            .filter(pk=delivery_id)
            .first()
        )
        if delivery is None:
            raise NotFound(
                f"delivery_id: no webhook delivery with id {delivery_id}",
                data={"field": "delivery_id"},
            )
        if delivery.status == WebhookDelivery.Status.PENDING:
            raise Conflict(
                f"webhook {delivery.webhook_id} is still pending; its next attempt is already due"
            )
        if not delivery.endpoint.enabled:
            raise Conflict(
                f"webhook {delivery.webhook_id}: endpoint {url_for_log(delivery.endpoint.url)} "
                f"is disabled ({delivery.endpoint.disabled_reason or 'by an operator'}); "
                "enable it before resending"
            )
        previous = delivery.status
        WebhookDelivery.objects.filter(pk=delivery_id).update(
            status=WebhookDelivery.Status.PENDING,
            cycle_attempts=0,
            next_attempt_at=now,
            finished_at=None,
            resent_at=now,
            updated_at=now,
        )
        AuditEntry.objects.create(
            actor=actor,
            action="webhook.resend",
            target=f"webhook-delivery:{delivery_id}",
            data={
                "webhook_id": delivery.webhook_id,
                "endpoint": url_for_log(delivery.endpoint.url),
                "alert": delivery.alert_id,
                "previous_status": previous,
            },
        )
        transaction.on_commit(lambda: _enqueue([delivery_id]))
    delivery.refresh_from_db()
    return delivery
