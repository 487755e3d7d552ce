"""Provider waits in a turn (architecture.md §6.6, §6.9): the admission check before a primary call,
holding the turn, recording a stated wait, an ephemeral run's sleep, and the pacing a release
falls back to."""

from __future__ import annotations

import math
import random
import threading
import time
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentops.models import Provider
from agentops.text import NOTE_TEXT_LIMIT, bound_text
from calls.records import ms_to_dt
from calls.types import ProviderError
from inference.models import InferenceCall, Turn
from turns.moves import holds_logged, turn_hold
from turns.queue import schedule_drain
from waits.admission import Hold, admission_check, remaining_ms
from waits.limits import limit_record


def held_by(hold: Hold) -> str:
    """What holds a call, in words: a provider's wait on a model, or a budget (§18.3)."""
    if hold.by == "budget":
        return hold.reason
    return f"provider wait on {hold.model}: {hold.reason}"


def hold_if_waiting(rechecks: Rechecks, turn: Turn) -> bool:
    """The admission check (architecture.md §6.6), at the last moment before a primary call. If a
    provider wait binds the agent's model, hold the turn (no failure, no note) until it ends
    or is released, and schedule the re-check. Returns True when the turn is held."""
    now_ms = time.time() * 1000
    hold = admission_check(agent=turn.agent, model=turn.agent.model, now_ms=now_ms)
    if hold is None:
        return False
    until = ms_to_dt(hold.until_ms)
    reason = bound_text(held_by(hold), NOTE_TEXT_LIMIT)
    turn_hold(turn=turn, until=until, reason=reason, logged=rechecks.logged)
    left = remaining_ms(hold, now_ms)
    # Re-check when the wait ends, and at least every AGENTOPS_WAIT_RECHECK_MS (a wait "until
    # released", unreadable records that may read again); a release also wakes the turn.
    recheck_ms = (
        settings.AGENTOPS_WAIT_RECHECK_MS
        if left is None
        else min(left + 10, settings.AGENTOPS_WAIT_RECHECK_MS)
    )
    if hold.scope != "agent" and left is not None and left + 10 <= recheck_ms:
        # Many agents share a scoped wait: they resume spread out, not in one second; the
        # provider's own quota (§6.13) then paces them at the rate it states.
        recheck_ms += random.uniform(0, settings.AGENTOPS_RESUME_SPREAD_MS)
    _recheck_once(rechecks, turn.agent_id, recheck_ms / 1000)
    return True


def hold_for_project_limit(rechecks: Rechecks, turn: Turn, error: ProviderError) -> bool:
    """A call its project's limit refused for longer than a turn waits (architecture.md §6.14):
    hold the turn (no failure, no note, no wait recorded: the limit is the project's, not the
    provider's) until the window may have room, and re-check then. False if it moved meanwhile."""
    wait_ms = error.retry_after_ms if error.retry_after_ms is not None else 1000.0
    until = timezone.now() + timedelta(milliseconds=wait_ms)
    reason = bound_text(error.message, NOTE_TEXT_LIMIT)
    if not turn_hold(turn=turn, until=until, reason=reason, logged=rechecks.logged):
        return False
    # Many turns of the project resume spread out, each then taking its place in the window.
    spread = random.uniform(0, settings.AGENTOPS_RESUME_SPREAD_MS)
    _recheck_once(rechecks, turn.agent_id, (wait_ms + 10 + spread) / 1000)
    return True


# A scheduled re-check due later than this is still ahead; one due sooner may be the delivery
# now running (Celery runs a countdown at its instant or after it, never before).
RECHECK_AHEAD_S = 0.25
# Past this many agents, the re-checks already due are forgotten (a bound, not a policy).
RECHECKS_KEPT = 10_000


class Rechecks:
    """The re-check this process scheduled for each held agent, by when it is due (monotonic):
    a part of the runtime, so every drain of a held turn (the sweep's, a release's, a duplicate
    delivery's) does not start a chain of re-checks of its own. ``logged``: the last hold it
    logged per turn, so a re-check that holds a turn by the same wait logs nothing new."""

    def __init__(self) -> None:
        self.logged = holds_logged()
        self._due: dict[int, float] = {}
        self._lock = threading.Lock()  # asked from the runtime's database threads

    async def stop(self) -> None:
        pass

    def ahead(self, agent_id: int, now: float, delay_s: float) -> bool:
        """Whether a re-check of the agent's is still ahead and comes no later than ``delay_s``."""
        with self._lock:
            due = self._due.get(agent_id)
        return due is not None and now + RECHECK_AHEAD_S < due <= now + delay_s + RECHECK_AHEAD_S

    def scheduled(self, agent_id: int, due: float) -> None:
        with self._lock:
            if len(self._due) > RECHECKS_KEPT:
                now = time.monotonic()
                for stale in [a for a, d in self._due.items() if d < now]:
                    del self._due[stale]
            self._due[agent_id] = due


def _recheck_once(rechecks: Rechecks, agent_id: int, delay_s: float) -> None:
    """Schedule the held agent's re-check in ``delay_s``, unless one this process scheduled is
    still ahead and comes no later: were each drain to schedule its own re-check, which
    schedules the next, every sweep would start one more chain and a long hold would drain its
    agent more often by the minute. Recorded when the scheduling transaction commits."""
    now = time.monotonic()
    if rechecks.ahead(agent_id, now, delay_s):
        return
    schedule_drain(agent_id, delay_s)
    transaction.on_commit(partial(rechecks.scheduled, agent_id, now + delay_s))


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


def record_wait(
    turn: Turn,
    error: ProviderError,
    now_ms: float,
    *,
    model: str | None = None,
    provider: Provider | None = None,
) -> bool:
    """Record what the refusal says for the target that stated it (``model`` on
    ``provider``, the agent's own by default), at the scope it binds (§6.12). Returns whether
    it binds."""
    agent = turn.agent
    recorded = limit_record(
        agent=agent,
        provider=provider or agent.provider,
        model=model or agent.model,
        error=error,
        now_ms=now_ms,
        own_provider=provider is None or provider.pk == agent.provider_id,
    )
    return recorded.binding


def ephemeral_sleep_ms(error: ProviderError) -> float | None:
    """How long an ephemeral run sleeps a stated wait before its next call (it records none:
    architecture.md §6.9), or None when the wait is longer than it sleeps (the run ends now)."""
    wait = error.retry_after_ms if error.retry_after_ms is not None else 0.0
    if math.isfinite(wait) and wait <= settings.AGENTOPS_EPHEMERAL_MAX_SLEEP_MS:
        return max(wait, 0.0)
    return None


def own_pacing_ms(error: ProviderError) -> float:
    """The stated wait was already over when recorded: pace ourselves rather than call again
    at once."""
    return settings.AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS if error.type == "rate_limit" else 1000.0


def ephemeral_wait_error(error: ProviderError) -> ProviderError:
    limit_s = settings.AGENTOPS_EPHEMERAL_MAX_SLEEP_MS / 1000
    wait = error.retry_after_ms if error.retry_after_ms is not None else math.nan
    asked = f"{wait / 1000:.0f} s" if math.isfinite(wait) else "longer than can be represented"
    message = (
        f"{error.message[:300]} (the provider asked to wait {asked}; "
        f"an ephemeral run doesn't sleep a stated wait longer than {limit_s:.0f} s, so it ends now)"
    )
    return ProviderError(
        type=error.type,
        message=message,
        http_status=error.http_status,
        provider_code=error.provider_code,
        retryable=False,
        retry_after_ms=error.retry_after_ms,
    )
