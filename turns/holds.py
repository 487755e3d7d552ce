"""Provider waits in a turn (architecture.md §6.6, §6.9): the admission check before a primary call,
holding the turn, recording a stated wait, an ephemeral run's sleep, and the pacing a release
falls back to."""

from __future__ import annotations

import math
import threading
import time
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentops.models import Agent
from agentops.text import NOTE_TEXT_LIMIT, bound_text
from calls.records import ms_to_dt
from calls.types import ProviderError
from inference.models import InferenceCall, Turn
from turns.queue import schedule_drain
from turns.services import turn_hold
from waits.admission import admission_check, remaining_ms
from waits.services import wait_record


def hold_if_waiting(turn: Turn) -> bool:
    """The admission check (architecture.md §6.6), at the last moment before a primary call. If a
    provider wait binds the agent's model, hold the turn (no failure, no note) until it ends
    or is released, and schedule the re-check. Returns True when the turn is held."""
    now_ms = time.time() * 1000
    hold = admission_check(agent=turn.agent, model=turn.agent.model, now_ms=now_ms)
    if hold is None:
        return False
    until = ms_to_dt(hold.until_ms)
    reason = bound_text(f"provider wait on {hold.model}: {hold.reason}", NOTE_TEXT_LIMIT)
    turn_hold(turn=turn, until=until, reason=reason)
    left = remaining_ms(hold, now_ms)
    # Re-check when the wait ends, and at least every AGENTOPS_WAIT_RECHECK_MS (a wait "until
    # released", unreadable records that may read again); a release also wakes the turn.
    recheck_ms = (
        settings.AGENTOPS_WAIT_RECHECK_MS
        if left is None
        else min(left + 10, settings.AGENTOPS_WAIT_RECHECK_MS)
    )
    _recheck_once(turn.agent_id, recheck_ms / 1000)
    return True


# The re-check this process has scheduled for each held agent: when it is due (monotonic).
_rechecks: dict[int, float] = {}
_rechecks_lock = threading.Lock()
# A scheduled re-check due later than this is still ahead; one due sooner may be the delivery
# now running (Celery runs a countdown at its instant or after it, never before).
RECHECK_AHEAD_S = 0.25


def _recheck_once(agent_id: int, delay_s: float) -> None:
    """Schedule the held agent's re-check in ``delay_s``, unless one this process scheduled is
    still ahead and comes no later. Every drain of a held turn re-checks it (the sweep's, a
    release's, a duplicate delivery's): were each to schedule its own re-check, which schedules
    the next, every sweep would start one more chain and a long hold would drain its agent
    more often by the minute. Recorded when the scheduling transaction commits."""
    now = time.monotonic()
    with _rechecks_lock:
        due = _rechecks.get(agent_id)
        if due is not None and now + RECHECK_AHEAD_S < due <= now + delay_s + RECHECK_AHEAD_S:
            return
    schedule_drain(agent_id, delay_s)
    transaction.on_commit(partial(_rechecked, agent_id, now + delay_s))


def _rechecked(agent_id: int, due: float) -> None:
    with _rechecks_lock:
        if len(_rechecks) > 10_000:
            now = time.monotonic()
            for stale in [a for a, d in _rechecks.items() if d < now]:
                del _rechecks[stale]
        _rechecks[agent_id] = due


def pacing_left_ms(turn: Turn) -> float:
    """After a hold ends early (a release): if the lifted wait was a 429's and lengthened the
    service's own pacing, the next call still keeps that pacing (a release never lengthens a
    hold, and never shortens it below the pacing a 429 with no stated wait would get)."""
    last = (
        InferenceCall.objects.filter(turn=turn)
        .exclude(error=None)
        .order_by("-id")
        .values("error", "ended_at")
        .first()
    )
    if last is None or last["ended_at"] is None:
        return 0.0
    error: dict[str, Any] = last["error"] or {}
    if error.get("type") != "rate_limit":
        return 0.0
    stated = error.get("retry_after_ms")
    ended_ms = last["ended_at"].timestamp() * 1000
    pacing_end = ended_ms + settings.AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS
    lengthened = error.get("until_released") or (
        stated is not None and ended_ms + stated > pacing_end
    )
    return max(pacing_end - time.time() * 1000, 0.0) if lengthened else 0.0


def next_call_at(*, agent: str, model: str) -> datetime:
    """After a release: the earliest instant the next call for (agent, model) may go. Now,
    unless the lifted wait was a 429's whose pacing still runs (``pacing_left_ms``) or an open
    turn keeps a later instant of its own (``Turn.not_before``: a retry delay, a re-arm)."""
    now = timezone.now()
    left_ms = 0.0
    for turn in Turn.objects.filter(agent__name=agent, agent__model=model, status__in=Turn.OPEN):
        left_ms = max(left_ms, pacing_left_ms(turn))
        if turn.not_before is not None:
            left_ms = max(left_ms, (turn.not_before - now).total_seconds() * 1000)
    return now + timedelta(milliseconds=left_ms)


def record_wait(turn: Turn, error: ProviderError, now_ms: float) -> bool:
    """Record the provider's stated wait for (agent, model). Returns whether it binds."""
    recorded = wait_record(
        agent=turn.agent,
        model=turn.agent.model,
        retry_after_ms=error.retry_after_ms if error.retry_after_ms is not None else 0,
        reason=f"{error.type} (HTTP {error.http_status}): {error.message[:300]}",
        now_ms=now_ms,
    )
    return recorded.binding


def stated_wait(
    turn: Turn, error: ProviderError, now_ms: float, *, recorded: bool | None = None
) -> float | None:
    """What to do with a retryable failure's stated wait: None when it was recorded and binds
    (the turn will be held), else the ms to sleep before the next call (an ephemeral run's
    short wait, or own pacing when the wait was already over), or -1 when an ephemeral run
    must end because the wait is longer than it sleeps. ``recorded``: the wait was already
    handed to the journal as the call ended (whether it binds)."""
    wait = error.retry_after_ms if error.retry_after_ms is not None else 0.0
    if turn.agent.kind == Agent.Kind.EPHEMERAL:
        if math.isfinite(wait) and wait <= settings.AGENTOPS_EPHEMERAL_MAX_SLEEP_MS:
            return max(wait, 0.0)
        return -1
    if recorded if recorded is not None else record_wait(turn, error, now_ms):
        return None
    # The stated wait was already over: pace ourselves rather than call again at once.
    return settings.AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS if error.type == "rate_limit" else 1000.0


def ephemeral_wait_error(error: ProviderError) -> ProviderError:
    limit_s = settings.AGENTOPS_EPHEMERAL_MAX_SLEEP_MS / 1000
    wait = error.retry_after_ms if error.retry_after_ms is not None else math.nan
    asked = f"{wait / 1000:.0f} s" if math.isfinite(wait) else "longer than can be represented"
    message = (
        f"{error.message[:300]} (the provider asked to wait {asked}; an ephemeral run doesn't sleep a "
        f"stated wait longer than {limit_s:.0f} s, so it ends now)"
    )
    return ProviderError(
        type=error.type,
        message=message,
        http_status=error.http_status,
        provider_code=error.provider_code,
        retryable=False,
        retry_after_ms=error.retry_after_ms,
    )
