"""Whether a provider is down (architecture.md §15): an episode begins with a call that fails so
that the provider itself looks unreachable or broken (a network or TLS error, an auth refusal, a
5xx) and ends with its first completed call. An episode that lasts
``AGENTOPS_PROVIDER_DOWN_AFTER_MS`` raises one ``provider-down`` alert naming the provider, the
address its calls went to and its last error (its ``agent`` is ``provider:<name>``, so each
provider has its own webhook cooldown): when the window passes (a task the episode's first
failure sends with that countdown), or at a failure after it if that comes first. The success
that ends it raises ``provider-up``. Other outcomes (a rate limit, a refused request, a cut) say
nothing either way.

The state is on the provider's row, so every process's calls count. A success needs a write
only when the row read with the call's start showed an episode."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any, Final

from django.conf import settings
from django.db import DatabaseError, transaction
from django.utils import timezone

from agentops.alerts import alert_raise
from agentops.celery import task_send
from agentops.models import Provider
from agentops.rows import after_commit
from calls.client import CallResult

logger = logging.getLogger(__name__)

# Its registered name (interfaces.tasks): services send tasks by name and import no tasks module.
PROVIDER_DOWN_CHECK: Final = "calls.tasks.provider_down_check"

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
    window = timedelta(milliseconds=settings.AGENTOPS_PROVIDER_DOWN_AFTER_MS)
    with transaction.atomic():
        row = Provider.objects.select_for_update().filter(pk=provider_id).first()
        if row is None:
            return
        began = row.failing_since is None
        row.failing_since = row.failing_since or now
        row.last_failure = error
        alert = row.down_alerted_at is None and now - row.failing_since >= window
        if alert:
            row.down_alerted_at = now
        row.save(update_fields=["failing_since", "last_failure", "down_alerted_at"])
        if alert:
            _alert_down(row, now)
        elif began:
            # The alert is owed when the window passes, whoever calls then: a lone turn's
            # retries may come minutes apart, and a provider nobody calls stays down.
            _check_later(row.pk, window)


def _check_later(provider_id: int, after: timedelta) -> None:
    # The window goes with the task: the episode is judged by the window it began under.
    window_ms = int(after.total_seconds() * 1000)
    after_commit(
        lambda: task_send(
            PROVIDER_DOWN_CHECK, provider_id, window_ms, countdown_s=after.total_seconds() + 0.5
        )
    )


def provider_down_check(*, provider_id: int, window_ms: int, now: datetime | None = None) -> bool:
    """The timer's end of an episode's window: the ``provider-down`` alert if the episode
    still runs, has lasted ``window_ms`` and has no alert yet (a redelivered or late task finds
    it raised and does nothing). True when it raised the alert."""
    now = now or timezone.now()
    window = timedelta(milliseconds=window_ms)
    with transaction.atomic():
        row = Provider.objects.select_for_update().filter(pk=provider_id).first()
        if row is None or row.failing_since is None or row.down_alerted_at is not None:
            return False
        if now - row.failing_since < window:
            # A newer episode than the task's (the first ended and another began): its own
            # task is on its way, but a lost one must not leave it silent.
            _check_later(row.pk, row.failing_since + window - now)
            return False
        row.down_alerted_at = now
        row.save(update_fields=["down_alerted_at"])
        _alert_down(row, now)
    return True


def failure_words(error: dict[str, Any]) -> str:
    """What a failure was, in words: no "HTTP None" for a call that got no answer."""
    status = error.get("http_status")
    kind = error.get("type")
    if status is None:
        return {
            "network": "no answer: the provider could not be reached",
            "auth": "the key was refused",
        }.get(str(kind), f"{kind}, with no HTTP answer")
    said = {
        "auth": "the key was refused",
        "server": "a server error",
        "overloaded": "overloaded",
    }.get(str(kind), str(kind))
    return f"{said}, HTTP {status}"


def _alert_down(row: Provider, now: datetime) -> None:
    assert row.failing_since is not None
    error: dict[str, Any] = row.last_failure or {}
    minutes = (now - row.failing_since).total_seconds() / 60
    # The alert is operator-only (the alerts API, the admin, webhooks), so it names the address
    # the calls went to, which tenants' copies of the error hide.
    alert_raise(
        kind="provider-down",
        agent=f"provider:{row.name}",
        model="*",
        message=(
            f"provider {row.name}: every call for {minutes:.0f} min has failed "
            f"({failure_words(error)}; the calls went to {row.base_url}): "
            f"{error.get('message')}. Check its base_url, its key "
            f"({row.api_key_env or 'none'}) and the network; "
            "its next successful call ends this."
        ),
        data={
            "provider": row.name,
            "base_url": row.base_url,
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
