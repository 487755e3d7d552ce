"""Keeping what a turn decided while the database does not answer (architecture.md §5.1, §6.4).

A call's outcome (its result, a stated wait, the next action) is decided in memory as soon as
the call ends. A stated wait goes to the journal's write path first (``waits.services``): a
write that fails is a pending act that binds in this process at once and is offered again
(``offer_pending_waits``). The rest of the bookkeeping (the call row, history, the turn's
status) goes through the runtime's ``db_durably``: retried while the database is unreachable
and this worker still holds the agent's turn lease, so nothing is called again for a result
already received, and the turn goes on as soon as the database is back.

``pace`` keeps the earliest instant of a turn's next call on the turn (``Turn.not_before``
and ``Turn.waiting_reason``), so the pacing after a 429, a retry delay or a re-arm is honoured
by whichever worker runs the turn next.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

from agentops.runtime import UNREACHABLE, Runtime, backoff_delays
from calls.types import ProviderError
from inference.models import Turn
from turns.policy import PolicySettings, RetryState
from turns.tracing import turn_event
from waits.journal import journal_pending, journal_session


def offer_pending_waits() -> bool:
    """Offer this process's pending journal acts now (a stated wait recorded while the
    database was down). True when none is left pending."""
    if not journal_pending():
        return True
    try:
        with journal_session(now_ms=time.time() * 1000):
            pass  # entering a session offers the pending acts, in order
    except UNREACHABLE:
        connection.close()
    return not journal_pending()


async def offer_pending_waits_until(runtime: Runtime, deadline_s: float) -> bool:
    """Offer the pending acts again with a backoff until none is left or ``deadline_s``
    (monotonic) passes: a run that ends (its lease taken, its turn done) still hands its
    stated waits to the journal before the process forgets about them."""
    delays = backoff_delays()
    while not await runtime.db(offer_pending_waits):
        if time.monotonic() >= deadline_s:
            return False
        await asyncio.sleep(next(delays))
    return True


def pace(turn: Turn, *, delay_ms: float, reason: str) -> datetime:
    """Keep on the turn that its next call may not go before ``delay_ms`` from now, and why."""
    not_before = timezone.now() + timedelta(milliseconds=max(delay_ms, 0.0))
    Turn.objects.filter(pk=turn.pk).update(
        not_before=not_before,
        waiting_reason=reason[:200],
        **turn_event(
            "agentops.turn.paced",
            {"agentops.pace.delay_ms": max(delay_ms, 0.0), "agentops.pace.reason": reason[:200]},
        ),
    )
    turn.not_before, turn.waiting_reason = not_before, reason[:200]
    return not_before


def paced_left_ms(turn: Turn) -> float:
    """How long the turn's kept pacing still runs (0 when none)."""
    if turn.not_before is None:
        return 0.0
    return max((turn.not_before - timezone.now()).total_seconds() * 1000, 0.0)


def retry_reason(error: ProviderError, state: RetryState, settings: PolicySettings) -> str:
    """Why a turn waits before its next call, as the operator reads it (``Turn.waiting_reason``)."""
    if error.type == "rate_limit":
        return "pacing after a 429"
    if error.type == "timeout" and error.bound is not None:
        return f"fresh call after a cut at the {error.bound} deadline"
    return f"retry {state.base_retries} of {len(settings.base_delays_ms)} after {error.type} error"
