"""Budgets and their reservation ledger (architecture.md §18).

A call that may cost reserves its worst case before it is sent (``budget_reserve``), under a
row lock on each budget it counts against, so the check "spent + reserved + this <= amount"
is serialized across every process; the reservation is replaced by the call's real cost when
its row ends (``budget_settle``, in the transaction that writes the row's cost). N workers can
then overspend a budget by at most what the reservations in flight under-estimated.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Literal
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from agentops.alerts import alert_raise
from agentops.exceptions import bad_field
from agentops.models import Agent, Budget, Project
from agentops.prices import MTOK, Terms, decimal_amount, decimal_text

logger = logging.getLogger(__name__)

PERIODS = ("day", "week", "month")

# Bumped whenever this process learns a budget hold changed (a refusal, a breach, a release, a
# budget set): admission's copy of the holds is read again at once here (waits.admission).
_changes = 0


def holds_changed() -> int:
    """How many times this process saw the budget holds change."""
    return _changes


def _changed() -> None:
    global _changes
    _changes += 1


AMOUNT_MAX = Decimal(10) ** 18


# --- the pure core ---------------------------------------------------------------------------


def period_bounds(period: str, at: datetime, tz: str) -> tuple[datetime, datetime]:
    """The calendar period holding ``at`` (aware), in the time zone ``tz``: its start and the
    start of the next (weeks start on Monday), both aware."""
    zone = ZoneInfo(tz)
    local = at.astimezone(zone)
    day = local.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        start, end = day, day + timedelta(days=1)
    elif period == "week":
        start = day - timedelta(days=day.weekday())
        end = start + timedelta(days=7)
    elif period == "month":
        start = day.replace(day=1)
        end = (start + timedelta(days=32)).replace(day=1)
    else:
        raise ValueError(f"period must be one of {PERIODS}, not {period!r}")
    # Rebuilt from the wall clock so a DST change inside the period moves the offset with it.
    start = start.replace(tzinfo=None).replace(tzinfo=zone)
    end = end.replace(tzinfo=None).replace(tzinfo=zone)
    return start, end


def reservation_amount(*, input_tokens: int, max_tokens: int, terms: Terms) -> Decimal:
    """A call's worst case: its input estimate at the dearest of the input, cached-input and
    cache-write prices (any of its input may be either) and ``max_tokens`` at the dearer of the
    output and reasoning prices (its output may all be reasoning)."""
    given = max(p for p in (terms.input, terms.cached_input, terms.cache_write) if p is not None)
    out = max(terms.output, terms.reasoning if terms.reasoning is not None else terms.output)
    return ((input_tokens * given + max_tokens * out) / MTOK).quantize(Decimal("1e-12"))


def fits(*, spent: Decimal, reserved: Decimal, more: Decimal, amount: Decimal) -> bool:
    return spent + reserved + more <= amount


# --- the ledger ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reserved:
    """One budget a call reserved against: settle it against the same period."""

    budget_id: int
    period_start: datetime
    amount: Decimal


Refusal = Literal["held", "edge", "busy"]


@dataclass(frozen=True)
class Refused:
    """Why a call is not sent, by the budget that refused it: ``held`` (the budget holds until
    ``resets_at``), ``edge`` (not held: another of the agent's targets still fits what is left,
    §18.4) or ``busy`` (not held: it fits once the calls in flight settle, §18.1)."""

    budget_id: int
    owner: str
    resets_at: datetime
    kind: Refusal = "held"
    worst: Decimal | None = None
    left: Decimal | None = None  # the amount less what is spent (and, busy, reserved)

    @property
    def reason(self) -> str:
        worst = decimal_text(self.worst)
        if self.kind == "edge":
            return (
                f"budget: this call's worst case ({worst}) is over what {self.owner}'s budget has "
                f"left ({decimal_text(self.left)}); a cheaper alternate of the agent's serves"
            )
        if self.kind == "busy":
            return (
                f"budget: {self.owner}'s budget has {decimal_text(self.left)} left after the calls "
                f"in flight, under this call's worst case ({worst}); it fits once they settle: "
                "called again shortly"
            )
        return (
            f"budget: {self.owner}'s budget is held until {self.resets_at.isoformat()}; "
            "an operator may raise it or release the hold"
        )


def refusal_until(message: str) -> datetime | None:
    """The reset instant a refusal's message (``Refused.reason``) names: the error of a call
    a budget refused travels as a ``ProviderError``, whose text is all it carries."""
    found = re.search(r"is held until (\S+);", message)
    try:
        return datetime.fromisoformat(found.group(1)) if found else None
    except ValueError:
        return None


def _owner(b: Budget) -> str:
    if b.agent is not None:
        return f"agent {b.agent.name}"
    assert b.project is not None
    return f"project {b.project.name}"


def _rolled(b: Budget, now: datetime) -> None:
    """Start a new period when ``now`` is past the ledger's: spent and reserved start at 0
    (a call reserved in the old period settles against nothing)."""
    start, _ = period_bounds(b.period, now, settings.AGENTOPS_BUDGET_TIME_ZONE)
    if start != b.period_start:
        b.period_start, b.spent, b.reserved = start, Decimal(0), Decimal(0)


def _resets_at(b: Budget) -> datetime:
    return period_bounds(b.period, b.period_start, settings.AGENTOPS_BUDGET_TIME_ZONE)[1]


def budget_reserve(
    *,
    agent: Agent,
    worst_case: Callable[[], Decimal | None],
    now: datetime,
    others: Callable[[], list[Decimal]] = list,
) -> tuple[list[Reserved] | Refused, Decimal | None]:
    """Reserve the call's ``worst_case()`` (None: the call is unpriced and cannot be bounded)
    on the agent's budget and its project's, under a row lock on each; returns what was
    reserved and the amount. Refused when a budget is held this period or the reservation
    does not fit; then nothing is reserved anywhere. A reservation that does not fit breaches
    the budget (it holds) unless the smallest of ``others()``, the same request's worst case
    on the agent's other priced targets, fits every budget: then it is refused at the edge."""
    mine = Q(agent_id=agent.pk) | Q(project_id=agent.project_id)
    # Most calls have no budget: one plain read, no transaction (its BEGIN and COMMIT were two
    # more round trips on every call's way out), and no worst case worked out.
    if not Budget.objects.filter(mine).exists():
        return [], None
    amount = worst_case()
    with transaction.atomic():
        budgets = list(
            Budget.objects.select_for_update(of=("self",))
            .select_related("agent", "project")
            .filter(mine)
            .order_by("id")  # one lock order for every process: no deadlock
        )
        if not budgets:
            return [], amount
        for b in budgets:
            _rolled(b, now)
        held = [b for b in budgets if b.held_period == b.period_start]
        short = [b for b in budgets if amount is not None and not _fits(b, amount)]
        if not held and short:
            # Not held yet: another target that fits, or the calls in flight settling, may
            # still let the agent go on within the amount (§18.4, §18.1).
            tightest = min(short, key=lambda b: b.amount - b.spent - b.reserved)
            refusal = replace(
                Refused(tightest.pk, _owner(tightest), _resets_at(tightest)),
                worst=amount,
                left=max(tightest.amount - tightest.spent - tightest.reserved, Decimal(0)),
            )
            settled = amount is not None and all(_fits(b, amount, settled=True) for b in short)
            kind: Refusal | None = (
                "edge" if _cheaper_fits(budgets, others) else "busy" if settled else None
            )
            if kind is not None:
                for b in budgets:
                    b.save(update_fields=["period_start", "spent", "reserved"])
                return replace(refusal, kind=kind), amount
        if held or short:
            breached = (held or short)[0]
            transaction.on_commit(_changed)
            if breached.held_period != breached.period_start:
                _breach(breached, agent=agent.name, now=now)
            for b in budgets:
                b.save(
                    update_fields=["period_start", "spent", "reserved", "held_period", "held_at"]
                )
            return Refused(breached.pk, _owner(breached), _resets_at(breached)), amount
        done = []
        for b in budgets:
            if amount:
                b.reserved += amount
            _maybe_warn(b, agent=agent.name)
            b.save(update_fields=["period_start", "spent", "reserved", "warned_period"])
            if amount:
                done.append(Reserved(b.pk, b.period_start, amount))
        return done, amount


def _fits(b: Budget, amount: Decimal, *, settled: bool = False) -> bool:
    """Whether ``amount`` more fits the budget this period (a released budget fits anything);
    ``settled``: once the calls in flight have settled (their reservations gone)."""
    return b.released_period == b.period_start or fits(
        spent=b.spent, reserved=Decimal(0) if settled else b.reserved, more=amount, amount=b.amount
    )


def _cheaper_fits(budgets: list[Budget], others: Callable[[], list[Decimal]]) -> bool:
    """Whether another target's worst case fits every budget: the call goes there (§18.4)."""
    least = min(others(), default=None)
    return least is not None and all(_fits(b, least) for b in budgets)


def budget_hold_tightest(*, agent: Agent, now: datetime) -> None:
    """Hold the agent's tightest budget: its call was refused at the edge but the cheaper
    target it was meant for could not serve (held or down), or refused as busy for so long that
    what is in flight is not settling (a reservation left by a process that died): nothing may
    go out now. The tightest (least left) is one the refused call did not fit."""
    with transaction.atomic():
        budgets = list(
            Budget.objects.select_for_update(of=("self",))
            .select_related("agent", "project")
            .filter(Q(agent_id=agent.pk) | Q(project_id=agent.project_id))
            .order_by("id")
        )
        for b in budgets:
            _rolled(b, now)
        open_ = [
            b
            for b in budgets
            if b.held_period != b.period_start and b.released_period != b.period_start
        ]
        if not open_:
            return
        tightest = min(open_, key=lambda b: b.amount - b.spent - b.reserved)
        _breach(tightest, agent=agent.name, now=now)
        tightest.save(update_fields=["period_start", "spent", "reserved", "held_period", "held_at"])


def budget_settle(*, reserved: list[Reserved], cost: Decimal | None, agent: str) -> None:
    """Replace each reservation by the call's real cost (None, unknown: 0), in the caller's
    transaction (the one writing the row's cost). A budget whose period rolled since is left
    alone: the call counted in the period it was sent in."""
    real = cost or Decimal(0)
    for r in reserved:
        changed = Budget.objects.filter(pk=r.budget_id, period_start=r.period_start).update(
            reserved=F("reserved") - r.amount, spent=F("spent") + real
        )
        if changed and real:
            b = (
                Budget.objects.select_for_update(of=("self",))
                .select_related("agent", "project")
                .get(pk=r.budget_id)
            )
            if (
                b.spent >= b.amount
                and b.held_period != b.period_start
                and b.released_period != b.period_start
            ):
                _breach(b, agent=agent, now=timezone.now())
                b.save(update_fields=["held_period", "held_at"])


def _breach(b: Budget, *, agent: str, now: datetime) -> None:
    b.held_period, b.held_at = b.period_start, now
    transaction.on_commit(_changed)
    resets = _resets_at(b)
    alert_raise(
        kind="budget-exceeded",
        agent=agent,
        model="*",
        message=(
            f"{_owner(b)}'s budget of {decimal_text(b.amount)} per {b.period} holds until "
            f"{resets.isoformat()}: spent {decimal_text(b.spent)} (reserved "
            f"{decimal_text(b.reserved)}), so a call's worst case no longer fits; no call that "
            "costs is sent for it until then unless an operator raises it or releases the hold"
        ),
        data={"budget": b.pk, "resets_at": resets.isoformat(), "amount": str(b.amount)},
    )


def _maybe_warn(b: Budget, *, agent: str) -> None:
    if b.warned_period == b.period_start or b.spent + b.reserved < b.amount * b.warn_at:
        return
    b.warned_period = b.period_start
    alert_raise(
        kind="budget-warning",
        agent=agent,
        model="*",
        message=(
            f"{_owner(b)} has spent or reserved {decimal_text(b.spent + b.reserved)} of its "
            f"budget of {decimal_text(b.amount)} per {b.period} (warns at {b.warn_at:.0%})"
        ),
        data={"budget": b.pk, "resets_at": _resets_at(b).isoformat(), "amount": str(b.amount)},
    )


# --- the budget hold (architecture.md §18.3) ---------------------------------------------------


@dataclass(frozen=True)
class BudgetHold:
    """A spent budget holding ``agent`` on every model until ``until`` (its period's reset)."""

    agent: str
    until: datetime
    reason: str
    set_at: datetime | None


def _binds(b: Budget, now: datetime) -> bool:
    start, _ = period_bounds(b.period, now, settings.AGENTOPS_BUDGET_TIME_ZONE)
    return b.held_period is not None and b.held_period == start == b.period_start


def _hold_reason(b: Budget) -> str:
    return (
        f"budget: {_owner(b)}'s budget of {decimal_text(b.amount)} per {b.period} holds (spent "
        f"{decimal_text(b.spent)}: a call's worst case no longer fits); an operator may raise it "
        "or release the hold"
    )


def budget_holds(*, agent: Agent | None = None, now: datetime) -> list[BudgetHold]:
    """The budget holds binding at ``now``: on ``agent`` (its own budget's and its project's),
    or on every agent. A project's hold binds each live agent of the project that records
    waits (not an ephemeral one, as for provider waits)."""
    held = Budget.objects.filter(held_period__isnull=False).select_related("agent", "project")
    if agent is not None:
        held = held.filter(Q(agent_id=agent.pk) | Q(project_id=agent.project_id))
    out = []
    for b in held:
        if not _binds(b, now):
            continue
        until = _resets_at(b)
        if b.agent is not None:
            names = [b.agent.name]
        elif agent is not None:
            names = [agent.name]
        else:
            names = list(
                Agent.objects.filter(project=b.project, disposed_at__isnull=True)
                .exclude(kind=Agent.Kind.EPHEMERAL)
                .values_list("name", flat=True)
            )
        out += [BudgetHold(n, until, _hold_reason(b), b.held_at) for n in names]
    return out


def budget_release(*, agent: str, now: datetime) -> list[BudgetHold]:
    """Lift the budget holds binding ``agent`` (its own budget's and its project's: a
    project's is lifted for every agent of the project), for the rest of the period."""
    found = Agent.objects.filter(name=agent).first()
    if found is None:
        return []
    lifted = budget_holds(agent=found, now=now)
    with transaction.atomic():
        for b in Budget.objects.select_for_update().filter(
            Q(agent_id=found.pk) | Q(project_id=found.project_id), held_period__isnull=False
        ):
            if _binds(b, now):
                b.released_period, b.held_period = b.period_start, None
                b.save(update_fields=["released_period", "held_period"])
        transaction.on_commit(_changed)
    return lifted


# --- the API's services ---------------------------------------------------------------------


def check_budget(body: Any) -> tuple[Decimal, str, Decimal]:
    """The (amount, period, warn_at) of a ``PUT .../budget`` body; else a 400 naming the field."""
    if not isinstance(body, dict):
        raise bad_field("body", "must be an object {amount, period, warn_at?}")
    unknown = sorted(set(body) - {"amount", "period", "warn_at"})
    if unknown:
        raise bad_field(unknown[0], "is not a field of a budget {amount, period, warn_at?}")
    amount = _decimal("amount", body.get("amount"))
    if amount <= 0 or amount >= AMOUNT_MAX:
        raise bad_field("amount", f"must be more than 0 and less than {AMOUNT_MAX}")
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -12:
        raise bad_field("amount", "must have at most 12 decimal places")
    period = body.get("period")
    if period not in PERIODS:
        raise bad_field("period", 'must be "day", "week" or "month"')
    warn_at = _decimal("warn_at", body.get("warn_at", "0.8"))
    if not Decimal(0) < warn_at <= Decimal(1) or warn_at != round(warn_at, 4):
        raise bad_field("warn_at", "must be more than 0 and at most 1, with 4 places at most")
    return amount, str(period), warn_at


def _decimal(field: str, value: Any) -> Decimal:
    return decimal_amount(field, value, example="10.00")


def budget_put(
    *,
    owner: Agent | Project,
    amount: Decimal,
    period: str,
    warn_at: Decimal,
    now: datetime,
    spent_since: Callable[[datetime], Decimal],
) -> Budget:
    """Set the budget of ``owner``. Raising it lifts a hold it no longer justifies. A new
    budget, or a change of period, starts its ledger from what ``spent_since(start)`` says the
    owner's calls ended in the period so far cost: a budget set at noon counts the morning."""
    key: dict[str, Agent | Project] = (
        {"agent": owner} if isinstance(owner, Agent) else {"project": owner}
    )
    with transaction.atomic():
        b = Budget.objects.select_for_update().filter(**key).first()
        start, _ = period_bounds(period, now, settings.AGENTOPS_BUDGET_TIME_ZONE)
        if b is None or b.period != period:
            # Calls in flight reserved nothing on this ledger: they settle on none (§18.1).
            b = b or Budget(**key)
            b.period_start, b.spent, b.reserved = start, spent_since(start), Decimal(0)
        b.amount, b.period, b.warn_at = amount, period, warn_at
        if b.pk is not None:
            _rolled(b, now)
        if b.held_period == b.period_start and b.spent + b.reserved < amount:
            b.held_period = None
        b.released_period = None  # a budget set again is enforced again
        b.save()
        transaction.on_commit(_changed)
        return b


def budget_out(b: Budget, now: datetime) -> dict[str, Any]:
    """As API.md shapes it: the ledger of the period in force at ``now``."""
    start, resets = period_bounds(b.period, now, settings.AGENTOPS_BUDGET_TIME_ZONE)
    current = start == b.period_start
    return {
        "amount": decimal_text(b.amount),
        "period": b.period,
        "warn_at": float(b.warn_at),
        "spent": decimal_text(b.spent if current else Decimal(0)),
        "reserved": decimal_text(b.reserved if current else Decimal(0)),
        "held": current and b.held_period == b.period_start,
        "resets_at": resets,
    }
