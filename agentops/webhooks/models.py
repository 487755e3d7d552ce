"""Webhook endpoints, deliveries and attempts (architecture.md §8).

A delivery is one alert for one endpoint: its ``webhook_id`` and body are fixed when it is
queued, in the alert's own transaction, and stay the same across retries and resends. Each try
is an attempt row, written before the request goes out. Nothing here is deleted by the service.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.db import models

from agentops.models import Alert
from agentops.urlsafety import HostUnresolved, url_for_log, url_refusal

from .signing import SECRET_PREFIX, message_id_generate, secret_bytes, secret_generate


def validate_webhook_url(value: str) -> None:
    """Refuse a URL the service must not send to (see ``urlsafety``). Resolves the host: a caller
    that validates inside a transaction looks the host up first with ``urlsafety.resolved_ahead``
    (the admin does), so the transaction does not wait on DNS."""
    try:
        reason = url_refusal(value, allow_private=settings.AGENTOPS_WEBHOOKS_ALLOW_PRIVATE)
    except HostUnresolved as exc:
        reason = str(exc)
    if reason:
        raise ValidationError(reason, code="unsafe_url")


def validate_webhook_secret(value: str) -> None:
    try:
        if not value.startswith(SECRET_PREFIX):
            raise ValueError(f"it must start with {SECRET_PREFIX}")
        secret_bytes(value)
    except ValueError as exc:
        raise ValidationError(
            f"not a webhook secret: {exc} (whsec_ followed by base64)", code="bad_secret"
        ) from None


class WebhookEndpoint(models.Model):
    url = models.URLField(max_length=500, validators=[validate_webhook_url])
    # Alert kinds this endpoint receives; empty receives every kind.
    kinds = ArrayField(
        models.CharField(max_length=50),
        blank=True,
        default=list,
        help_text=(
            "Alert kinds to send, comma-separated (provider-wait, hard-down, history-kept, "
            "turn-exhausted, provider-down, provider-up, journal-act-dropped). Empty: every kind."
        ),
    )
    secret = models.CharField(
        max_length=100,
        default=secret_generate,
        validators=[validate_webhook_secret],
        help_text="whsec_…: receivers verify signatures with it.",
    )
    description = models.CharField(max_length=200, blank=True, default="")
    enabled = models.BooleanField(default=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    disabled_reason = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        verbose_name = "webhook endpoint"

    def __str__(self) -> str:
        # Also what the admin's change log records: never the URL's credentials or query.
        return url_for_log(self.url)


class WebhookCooldown(models.Model):
    """When an (endpoint, agent, kind, verdict) key last had a delivery queued. One row per key,
    claimed with an upsert so concurrent raisers in any process agree on who queues."""

    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="+")
    agent = models.CharField(max_length=100)
    kind = models.CharField(max_length=50)
    verdict = models.CharField(max_length=50, blank=True, default="")
    last_queued_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "agent", "kind", "verdict"], name="webhook_cooldown_key_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.endpoint_id}: {self.agent} {self.kind} {self.verdict}".strip()


class WebhookDelivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"  # an attempt is due at next_attempt_at (or one is under way)
        DELIVERED = "delivered"
        FAILED = "failed"  # refused for good: a 4xx, a refused URL, a disabled endpoint
        GAVE_UP = "gave_up"  # retryable failures until the attempts ran out

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.PROTECT, related_name="deliveries"
    )
    alert = models.ForeignKey(Alert, on_delete=models.PROTECT, related_name="webhook_deliveries")
    webhook_id = models.CharField(max_length=64, unique=True, default=message_id_generate)
    # The exact body sent and signed, frozen when the delivery is queued.
    payload = models.TextField()
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)  # every attempt, resends included
    cycle_attempts = models.PositiveIntegerField(default=0)  # since it was queued or last resent
    # When the next attempt is due; while one runs, when its claim lapses (the sweep retries it).
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=1000, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    resent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name = "webhook delivery"
        verbose_name_plural = "webhook deliveries"
        indexes = [models.Index(fields=["status", "next_attempt_at"])]
        permissions = [("resend_webhookdelivery", "Can resend webhook deliveries")]

    def __str__(self) -> str:
        return f"{self.webhook_id} → {self.endpoint_id} ({self.status})"


class WebhookAttempt(models.Model):
    class Outcome(models.TextChoices):
        DELIVERED = "delivered"
        RETRY = "retry"
        FAILED = "failed"
        GAVE_UP = "gave_up"
        REFUSED = "refused"  # not sent: the URL is refused or the endpoint disabled

    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.PROTECT, related_name="attempt_rows"
    )
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=20, choices=Outcome.choices, blank=True, default="")
    status_code = models.PositiveIntegerField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    # The receiver's answer or the error, bounded before it is stored.
    response_excerpt = models.TextField(blank=True, default="")
    error = models.CharField(max_length=1000, blank=True, default="")

    class Meta:
        ordering = ["delivery_id", "number"]
        constraints = [
            models.UniqueConstraint(
                fields=["delivery", "number"], name="webhook_attempt_number_unique"
            )
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.delivery_id}"
