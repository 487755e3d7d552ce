"""Admission (architecture.md §6.6, §15): may a call to this model be made for this agent now?

A wait committed by any process binds every process's next call: each check asks the journal
whether rows were appended since this process last read it (one indexed ``SELECT max(id)``)
and reads only those. The rest of the view is cached per process (``waits.journal``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from django.db import DatabaseError

from agentops.budgets import budget_holds, holds_changed
from agentops.memory import Recent
from agentops.models import Agent

from .core import EVERY_MODEL, WaitBook, wait_binds
from .journal import journal_binding


@dataclass(frozen=True, slots=True)
class Hold:
    """Why a call is not admitted. ``until_ms`` None: until released (or, for ``unreadable``,
    until the records read again). ``model`` is ``*`` when the records are unreadable: every
    model of every agent is held."""

    until_ms: int | None
    reason: str
    model: str
    source: Literal["recorded", "pending", "unreadable"]
    # What holds: a provider's wait from the journal, or a spent budget (§18.3).
    by: Literal["provider", "budget"] = "provider"
    # Whom the wait binds (§6.12): the agent, every agent on the provider's model, or every
    # agent and model on the provider; ``operator`` for an operator's own hold.
    scope: Literal["agent", "model", "provider"] = "agent"
    operator: bool = False


def admission_check(*, agent: Agent, model: str, now_ms: float, provider: str = "") -> Hold | None:
    """None when a call to ``model`` (on ``provider``, "" for the agent's own) for ``agent``
    may go out at ``now_ms``, else the hold.

    An ephemeral agent is never held: nothing is recorded for it (§6.9), and it is not held by
    unreadable records either. Pass the real time: the cached view is refreshed on the
    cadence ``now_ms`` shows."""
    return admission_checks(agent=agent, targets=[(model, provider)], now_ms=now_ms)[0]


def admission_checks(
    *, agent: Agent, targets: Sequence[tuple[str, str]], now_ms: float
) -> list[Hold | None]:
    """``admission_check`` for each (model, provider) of ``targets``, from one read of the
    journal (an agent's alternates are checked together: §6.11)."""
    if agent.kind == Agent.Kind.EPHEMERAL:
        return [None] * len(targets)
    book = journal_binding(now_ms=now_ms, fresh=True)
    holds = [_hold(book, agent, model, provider, now_ms) for model, provider in targets]
    budget = _budget_hold(agent, now_ms, book)
    if budget is not None and not wait_binds(budget.until_ms, now_ms):
        budget = None
    # A spent budget holds every model, on every provider, beside the journal (§18.3): only a
    # hold until released outlasts it.
    return [
        h if budget is None or (h is not None and h.until_ms is None) else budget for h in holds
    ]


# How long a process's copy of an agent's budget holds is used: the steady-state check stays
# the journal's one indexed query. A release appends a journal row (a new book) and this
# process's own refusals and changes bump ``holds_changed``, so both are seen at once; a hold
# another process records is seen within this, while its reservation, under the budget's lock,
# already refuses every call (§18.3).
BUDGET_HOLDS_CACHE_S = 1.0
_budget_copies: Recent[int, tuple[WaitBook, int, float, Hold | None]] = Recent(
    size=10_000, ttl_s=BUDGET_HOLDS_CACHE_S
)


def _budget_hold(agent: Agent, now_ms: float, book: WaitBook) -> Hold | None:
    if agent.pk is None:
        return None
    kept = _budget_copies.get(agent.pk)
    now = time.monotonic()
    if (
        kept is not None
        and kept[0] is book
        and kept[1] == holds_changed()
        and now - kept[2] < BUDGET_HOLDS_CACHE_S
    ):
        return kept[3]
    changes = holds_changed()
    try:
        hold = _budget_hold_read(agent, now_ms)
    except DatabaseError:
        # Admission keeps answering from the journal's view while the database is away; the
        # reservation, which needs the database to send anything that costs, still decides.
        return kept[3] if kept is not None else None
    _budget_copies.put(agent.pk, (book, changes, now, hold))
    return hold


def _budget_hold_read(agent: Agent, now_ms: float) -> Hold | None:
    held = budget_holds(agent=agent, now=datetime.fromtimestamp(now_ms / 1000, tz=UTC))
    if not held:
        return None
    first = min(held, key=lambda h: h.until)
    last = max(held, key=lambda h: h.until)  # two spent budgets: held until both reset
    return Hold(
        until_ms=math.ceil(last.until.timestamp() * 1000),
        reason=first.reason,
        model=EVERY_MODEL,
        source="recorded",
        by="budget",
    )


def _hold(book: WaitBook, agent: Agent, model: str, provider: str, now_ms: float) -> Hold | None:
    if book.unknown(agent.name, model):
        assert book.unreadable is not None
        cause = book.unreadable
        return Hold(
            until_ms=None,
            reason=(
                f"the provider-waits journal cannot be read ({cause.describe()}); "
                "every model is held until it reads again or an operator releases"
            ),
            model=EVERY_MODEL,
            source="unreadable",
        )
    if book.scoped_known and (provider or agent.provider_id is not None):
        # Read the agent's provider only when a scoped wait or an operator's hold exists.
        wait = book.binding_on(
            agent=agent.name,
            model=model,
            provider=provider,
            provider_name=provider or agent.provider.name,
            now_ms=now_ms,
        )
    else:
        wait = book.lookup(agent.name, model, provider)
    if wait is None or not wait_binds(wait.until, now_ms):
        return None
    return Hold(
        until_ms=wait.until,
        reason=wait.reason,
        model=model,
        source=wait.source,
        scope=wait.scope,
        operator=bool(wait.ref),
    )


def remaining_ms(hold: Hold, now_ms: float) -> int | None:
    """How long the hold still runs at ``now_ms``, in whole ms rounded up (a client that waits
    that long finds it over); None when it runs until released."""
    if hold.until_ms is None:
        return None
    return max(0, math.ceil(hold.until_ms - now_ms))
