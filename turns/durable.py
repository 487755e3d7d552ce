"""Keeping what a turn decided while the database does not answer (architecture.md §5.1, §6.4).

A call's outcome (its result, a stated wait, the next action) is decided in memory as soon as
the call ends. A stated wait goes to the journal's write path first (``waits.services``): a
write that fails is a pending act that binds in this process at once and is offered again.
The rest of the bookkeeping (the call row, history, the turn's status) goes through
``durably``: retried with a short backoff while the database is unreachable and this worker
still holds the agent's turn lease, so nothing is called again for a result already received,
and the turn goes on as soon as the database is back.

``pace`` keeps the earliest instant of a turn's next call on the turn (``Turn.not_before``
and ``Turn.waiting_reason``), so the pacing after a 429, a retry delay or a re-arm is honoured
by whichever worker runs the turn next.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime, timedelta
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connection
from django.utils import timezone

from agentops.background import bookkeeping
from calls.types import ProviderError
from inference.models import Turn
from turns.lease import TurnLease
from turns.policy import PolicySettings, RetryState
from turns.tracing import turn_event
from waits.journal import journal_pending, journal_session

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Errors that mean "the database did not answer", not "the query is wrong": retried.
UNREACHABLE = (OperationalError, InterfaceError)
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 0.25


class LeaseLost(Exception):
    """The agent's turn lease was taken over while the bookkeeping waited for the database."""


def backoff_delays() -> Iterator[float]:
    delay = BACKOFF_FIRST_S
    while True:
        yield delay
        delay = min(delay * 2, BACKOFF_MAX_S)


def durably(what: str, fn: Callable[[], T], lease: TurnLease | None) -> T:
    """Run ``fn`` (one idempotent piece of bookkeeping) until the database answers it.

    While the database is unreachable it is tried again after a backoff of at most
    ``BACKOFF_MAX_S``, the lease is renewed at each try (the renewal by owner succeeds as
    soon as the database is back), and this process's pending journal acts are offered once
    it answers. Raises ``LeaseLost`` once another worker holds the lease (the turn is its
    now); any other error is raised as it is."""
    failed_at: float | None = None
    delays = backoff_delays()
    while True:
        try:
            result = fn()
        except UNREACHABLE as exc:
            connection.close()
            if failed_at is None:
                failed_at = time.monotonic()
                logger.warning(
                    "%s: the database did not answer (%s: %s); trying again until it does",
                    what,
                    type(exc).__name__,
                    str(exc)[:200],
                )
            time.sleep(next(delays))
            if lease is not None and not lease.renew_if_due():
                raise LeaseLost(what) from exc
            continue
        if failed_at is not None:
            logger.warning(
                "%s: done after the database came back (%.1f s)", what, time.monotonic() - failed_at
            )
            offer_pending_waits()
        return result


async def durably_on_loop(what: str, step: Callable[[], Awaitable[T]], lease: TurnLease) -> T:
    """``durably`` for a coroutine on the background loop (a turn's run, from the top): the
    database not answering any of its bookkeeping runs it again after the backoff, without a
    thread waiting meanwhile. Only for a step that is safe to run again: one that makes no
    call before its last write that is not ``durably`` itself."""
    failed_at: float | None = None
    delays = backoff_delays()
    while True:
        try:
            result = await step()
        except UNREACHABLE as exc:
            if failed_at is None:
                failed_at = time.monotonic()
                logger.warning(
                    "%s: the database did not answer (%s: %s); trying again until it does",
                    what,
                    type(exc).__name__,
                    str(exc)[:200],
                )
            await asyncio.sleep(next(delays))
            if not await bookkeeping(lease.renew_if_due):
                raise LeaseLost(what) from exc
            continue
        if failed_at is not None:
            logger.warning(
                "%s: done after the database came back (%.1f s)", what, time.monotonic() - failed_at
            )
            await bookkeeping(offer_pending_waits)
        return result


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


def offer_pending_waits_until(deadline_s: float) -> bool:
    """Offer the pending acts again with a backoff until none is left or ``deadline_s``
    (monotonic) passes: a run that ends (its lease taken, its turn done) still hands its
    stated waits to the journal before the process forgets about them."""
    delays = backoff_delays()
    while not offer_pending_waits():
        if time.monotonic() >= deadline_s:
            return False
        time.sleep(next(delays))
    return True


def pace(turn: Turn, *, delay_ms: float, reason: str, lease: TurnLease | None) -> datetime:
    """Keep on the turn that its next call may not go before ``delay_ms`` from now, and why."""
    not_before = timezone.now() + timedelta(milliseconds=max(delay_ms, 0.0))
    durably(
        f"turn {turn.pk}: keep its next call's earliest instant",
        lambda: Turn.objects.filter(pk=turn.pk).update(
            not_before=not_before,
            waiting_reason=reason[:200],
            **turn_event(
                "agentops.turn.paced",
                {
                    "agentops.pace.delay_ms": max(delay_ms, 0.0),
                    "agentops.pace.reason": reason[:200],
                },
            ),
        ),
        lease,
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
