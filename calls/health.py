"""Whether a provider is down (architecture.md §15): an episode begins with a call that fails so
that the provider itself looks unreachable or broken (a network or TLS error, an auth refusal, a
5xx) and ends with its first completed call. An episode that lasts
``AGENTOPS_PROVIDER_DOWN_AFTER_MS`` raises one ``provider-down`` alert naming the provider and
its last error (its ``agent`` is ``provider:<name>``, so each provider has its own webhook
cooldown); the success that ends it raises ``provider-up``. Other outcomes (a rate limit,
a refused request, a cut) say nothing either way.

The state is on the provider's row, so every process's calls count. A success needs a write
only when the row read with the call's start showed an episode."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from agentops.alerts import alert_raise
from agentops.models import Provider
from calls.client import CallResult

logger = logging.getLogger(__name__)

# The failures that say the provider (not the request, not its limits) is in trouble.
DOWN_TYPES = frozenset({"network", "auth", "server", "overloaded"})


def provider_health_note(
    *, provider: Provider, result: CallResult, now: datetime | None = None
) -> None:
    """Count a call's end towards its provider's episode. ``provider`` as read with the call.
    Never raises for the database: this is the watch on the provider, not the call's record,
    and a call's bookkeeping must not fail (and be run again) because of it."""
    try:
        _note(provider, result, now or timezone.now())
    except DatabaseError as exc:
        logger.warning(
            "provider %s: its health could not be noted (%s: %s)",
            provider.name,
            type(exc).__name__,
            str(exc)[:200],
        )


def _note(provider: Provider, result: CallResult, now: datetime) -> None:
    if result.outcome == "completed":
        if provider.failing_since is not None:
            _recovered(provider.pk, now)
        return
    error = result.error
    if error is not None and error.type in DOWN_TYPES:
        _failed(provider.pk, error.as_dict(), now)


def _failed(provider_id: int, error: dict[str, object], now: datetime) -> None:
    with transaction.atomic():
        row = Provider.objects.select_for_update().filter(pk=provider_id).first()
        if row is None:
            return
        row.failing_since = row.failing_since or now
        row.last_failure = error
        down_for = now - row.failing_since
        alert = row.down_alerted_at is None and down_for >= timedelta(
            milliseconds=settings.AGENTOPS_PROVIDER_DOWN_AFTER_MS
        )
        if alert:
            row.down_alerted_at = now
        row.save(update_fields=["failing_since", "last_failure", "down_alerted_at"])
        if alert:
            minutes = down_for.total_seconds() / 60
            alert_raise(
                kind="provider-down",
                agent=f"provider:{row.name}",
                model="*",
                message=(
                    f"provider {row.name}: every call for {minutes:.0f} min has failed "
                    f"({error.get('type')}, HTTP {error.get('http_status')}): "
                    f"{error.get('message')}. Check its base_url, its key "
                    f"({row.api_key_env or 'none'}) and the network; "
                    "its next successful call ends this."
                ),
                data={
                    "provider": row.name,
                    "failing_since": row.failing_since.isoformat(),
                    "last_error": error,
                },
            )


def _recovered(provider_id: int, now: datetime) -> None:
    with transaction.atomic():
        row = Provider.objects.select_for_update().filter(pk=provider_id).first()
        if row is None or row.failing_since is None:
            return
        began, alerted = row.failing_since, row.down_alerted_at
        row.failing_since = row.down_alerted_at = None
        row.save(update_fields=["failing_since", "down_alerted_at"])
        minutes = (now - began).total_seconds() / 60
        if alerted is not None:
            alert_raise(
                kind="provider-up",
                agent=f"provider:{row.name}",
                model="*",
                message=(
                    f"provider {row.name} answers again: "
                    f"a call completed after {minutes:.0f} min of failures"
                ),
                data={
                    "provider": row.name,
                    "failing_since": began.isoformat(),
                    "recovered_at": now.isoformat(),
                },
            )
        else:
            logger.info(
                "provider %s answers again after %.1f min of failures (no alert had gone out)",
                row.name,
                minutes,
            )
