"""Budgets and their reservation ledger (architecture.md §18).

A call that may cost reserves its estimate before it is sent (``budget_reserve``), under a row
lock on each budget it counts against, so the check "spent + reserved + this <= amount" is
serialized across every process; the reservation is replaced by the call's real cost when its
row ends (``budget_settle``, in the transaction that writes the row's cost, on the ledger it was
made on). N workers can then overspend a budget by at most what the reservations in flight
under-estimated. Its arithmetic is ``agentops.budget_core``; the API's parsing, writes and
output of a budget are ``agentops.budget_api``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from agentops.alerts import alert_raise
from agentops.budget_core import Estimate, fits, period_bounds
from agentops.models import Agent, Budget
from agentops.prices import decimal_text

# Bumped whenever this process learns a budget hold changed (a refusal, a breach, a release, a
# budget set): admission's copy of the holds is read again at once here (waits.admission).
_changes = 0


def holds_changed() -> int:
    """How many times this process saw the budget holds change."""
    return _changes


def holds_changed_here() -> None:
    """Count a change of the budget holds (after its transaction commits)."""
    global _changes
    _changes += 1


# --- the ledger ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reserved:
    """One budget a call reserved against: settle it on the same ledger (period and ledger)."""

    budget_id: int
    period_start: datetime
    amount: Decimal
    ledger: int = 0


Refusal = Literal["held", "edge", "busy", "too_large", "unpriced"]


@dataclass(frozen=True)
class Refused:
    """Why a call is not sent, by the budget that refused it: ``held`` (the budget holds until
    ``resets_at``), ``edge`` (not held: another of the agent's targets still fits what is left,
    §18.4), ``busy`` (not held: it fits once the calls in flight settle, §18.1), ``too_large``
    (not held: its estimate, or its ``max_tokens`` alone, is over the whole amount: it never
    fits; ``field`` names what to change) or ``unpriced`` (not held: no price in force, so it
    cannot be bounded). The numbers are the budget's ledger as the refusal read it."""

    budget_id: int
    owner: str
    resets_at: datetime
    kind: Refusal = "held"
    worst: Decimal | None = None
    left: Decimal | None = None  # the amount less what is spent and reserved
    spent: Decimal | None = None
    reserved: Decimal | None = None
    amount: Decimal | None = None
    output: Decimal | None = None  # the part of ``worst`` its max_tokens alone accounts for
    field: str | None = None  # too_large, unpriced: the request's field to change

    @property
    def reason(self) -> str:
        worst, left = decimal_text(self.worst), decimal_text(self.left)
        ledger = (
            f"spent {decimal_text(self.spent)}, reserved {decimal_text(self.reserved)} by the "
            f"calls in flight, {left} left of {decimal_text(self.amount)}"
        )
        if self.kind == "unpriced":
            return (
                f"budget: {self.owner}'s budget counts this call but its model has no price in "
                "force, so its cost cannot be bounded: add a price for it (or set "
                "AGENTOPS_BUDGET_UNPRICED=allow to send such calls uncounted)"
            )
        if self.kind == "too_large":
            if self.field == "max_tokens":
                return (
                    f"budget: this call's max_tokens alone would cost up to "
                    f"{decimal_text(self.output)}, more than {self.owner}'s whole budget of "
                    f"{decimal_text(self.amount)}: lower max_tokens"
                )
            return (
                f"budget: this call's estimate ({worst}) is more than {self.owner}'s whole "
                f"budget of {decimal_text(self.amount)}: it can never fit; shorten the request "
                "or raise the budget"
            )
        if self.kind == "edge":
            return (
                f"budget: this call's estimate ({worst}) is over what {self.owner}'s budget has "
                f"left ({ledger}); a cheaper alternate of the agent's serves"
            )
        if self.kind == "busy":
            return (
                f"budget: this call's estimate ({worst}) is over what {self.owner}'s budget has "
                f"left ({ledger}); it fits after the calls in flight settle: called again shortly"
            )
        numbers = f"this call's estimate {worst}; {ledger}" if self.worst is not None else ledger
        return (
            f"budget: {self.owner}'s budget is held until {self.resets_at.isoformat()}; "
            f"{numbers}; an operator may raise it or release the hold"
        )


def _owner(b: Budget) -> str:
    if b.agent is not None:
        return f"agent {b.agent.name}"
    assert b.project is not None
    return f"project {b.project.name}"


def period_rolled(b: Budget, now: datetime) -> None:
    """Start a new period when ``now`` is past the ledger's: spent and reserved start at 0
    (a call reserved in the old period settles against nothing)."""
    start, _ = period_bounds(b.period, now, settings.AGENTOPS_BUDGET_TIME_ZONE)
    if start != b.period_start:
        b.period_start, b.spent, b.reserved = start, Decimal(0), Decimal(0)


def _resets_at(b: Budget) -> datetime:
    return period_bounds(b.period, b.period_start, settings.AGENTOPS_BUDGET_TIME_ZONE)[1]


def _refused(b: Budget, kind: Refusal, estimate: Estimate | None, **more: Any) -> Refused:
    return Refused(
        b.pk,
        _owner(b),
        _resets_at(b),
        kind=kind,
        worst=estimate.amount if estimate is not None else None,
        output=estimate.output if estimate is not None else None,
        left=max(b.amount - b.spent - b.reserved, Decimal(0)),
        spent=b.spent,
        reserved=b.reserved,
        amount=b.amount,
        **more,
    )


LEDGER_FIELDS = ["period_start", "spent", "reserved", "refused_estimate", "refused_period"]


def budget_reserve(
    *,
    agent: Agent,
    estimate: Callable[[], Estimate | None],
    now: datetime,
    others: Callable[[], list[Decimal]] = list,
    unpriced: str = "refuse",
) -> tuple[list[Reserved] | Refused, Estimate | None]:
    """Reserve the call's ``estimate()`` (None: the call is unpriced and cannot be bounded) on
    the agent's budget and its project's, under a row lock on each; returns what was reserved
    and the estimate. Refused, with nothing reserved anywhere, when: the call is unpriced and
    ``unpriced`` is ``refuse``; its estimate (or its output bound alone) is over a budget's
    whole amount (``too_large``: it never fits, nothing holds); a budget is held this period;
    or the reservation does not fit. A reservation that does not fit holds the budget unless
    the smallest of ``others()``, the same request's estimate on the agent's other priced
    targets, fits every budget (refused at the edge), or it fits once the calls in flight
    settle (busy). A refusal raises no alert: alerts are on money spent (``budget_settle``)."""
    mine = Q(agent_id=agent.pk) | Q(project_id=agent.project_id)
    # Most calls have no budget: one plain read, no transaction (its BEGIN and COMMIT were two
    # more round trips on every call's way out), and no estimate worked out.
    if not Budget.objects.filter(mine).exists():
        return [], None
    est = estimate()
    with transaction.atomic():
        budgets = list(
            Budget.objects.select_for_update(of=("self",))
            .select_related("agent", "project")
            .filter(mine)
            .order_by("id")  # one lock order for every process: no deadlock
        )
        if not budgets:
            return [], est
        for b in budgets:
            period_rolled(b, now)
        enforced = [b for b in budgets if b.released_period != b.period_start]
        if est is None and unpriced == "refuse" and enforced:
            return _refused(enforced[0], "unpriced", None, field="model"), None
        held = [b for b in budgets if b.held_period == b.period_start]
        short = [b for b in budgets if est is not None and not _fits(b, est.amount)]
        if not held and short and est is not None:
            # Not held yet: another target that fits, or the calls in flight settling, may
            # still let the agent go on within the amount (§18.4, §18.1). A call over the
            # whole amount never fits: refused as it is, holding nothing for anyone.
            tightest = min(short, key=lambda b: b.amount - b.spent - b.reserved)
            never = [b for b in short if est.amount > b.amount]
            settled = all(_fits(b, est.amount, settled=True) for b in short)
            kind: Refusal | None = (
                "edge"
                if _cheaper_fits(budgets, others)
                else "too_large"
                if never
                else "busy"
                if settled
                else None
            )
            if kind is not None:
                _note_refused(budgets, est)
                if kind == "too_large":
                    b = min(never, key=lambda b: b.amount)
                    field = "max_tokens" if est.output > b.amount else "messages"
                    return _refused(b, kind, est, field=field), est
                return _refused(tightest, kind, est), est
        if held or short:
            breached = (held or short)[0]
            transaction.on_commit(holds_changed_here)
            if breached.held_period != breached.period_start:
                _breach(breached, agent=agent.name, now=now, alert=False)
            _note_refused(budgets, est, more=["held_period", "held_at"])
            return _refused(breached, "held", est), est
        done = []
        for b in budgets:
            if est is not None and est.amount:
                b.reserved += est.amount
                done.append(Reserved(b.pk, b.period_start, est.amount, b.ledger))
            b.save(update_fields=["period_start", "spent", "reserved"])
        return done, est


def _note_refused(
    budgets: list[Budget], est: Estimate | None, more: list[str] | None = None
) -> None:
    """Keep the refused call's estimate on each budget for the period (GET .../budget)."""
    for b in budgets:
        if est is not None:
            b.refused_estimate, b.refused_period = est.amount, b.period_start
        b.save(update_fields=LEDGER_FIELDS + (more or []))


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
            period_rolled(b, now)
        open_ = [
            b
            for b in budgets
            if b.held_period != b.period_start and b.released_period != b.period_start
        ]
        if not open_:
            return
        tightest = min(open_, key=lambda b: b.amount - b.spent - b.reserved)
        _breach(tightest, agent=agent.name, now=now, alert=False)
        tightest.save(update_fields=["period_start", "spent", "reserved", "held_period", "held_at"])


def budget_settle(*, reserved: list[Reserved], cost: Decimal | None, agent: str) -> None:
    """Replace each reservation by the call's real cost (None, unknown: 0), in the caller's
    transaction (the one writing the row's cost), on the ledger it was made on: a budget whose
    period rolled, or whose ledger started again (a new period set), since is left alone, so
    ``reserved`` never goes below 0. Money spent raises the alerts: ``budget-warning`` once
    spent reaches ``warn_at`` of the amount, ``budget-exceeded`` (and the hold) once it reaches
    the amount."""
    real = cost or Decimal(0)
    for r in reserved:
        changed = Budget.objects.filter(
            pk=r.budget_id, period_start=r.period_start, ledger=r.ledger
        ).update(reserved=F("reserved") - r.amount, spent=F("spent") + real)
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
                _breach(b, agent=agent, now=timezone.now(), alert=True)
                b.save(update_fields=["held_period", "held_at"])
            if _maybe_warn(b, agent=agent):
                b.save(update_fields=["warned_period"])


def _breach(b: Budget, *, agent: str, now: datetime, alert: bool) -> None:
    """Hold the budget for the rest of its period; ``alert``: its spend reached the amount."""
    b.held_period, b.held_at = b.period_start, now
    transaction.on_commit(holds_changed_here)
    if not alert:
        return
    resets = _resets_at(b)
    alert_raise(
        kind="budget-exceeded",
        agent=agent,
        model="*",
        message=(
            f"{_owner(b)} has spent {decimal_text(b.spent)} of its budget of "
            f"{decimal_text(b.amount)} per {b.period}: it holds until {resets.isoformat()}; no "
            "call that costs is sent for it until then unless an operator raises it or releases "
            "the hold"
        ),
        data={"budget": b.pk, "resets_at": resets.isoformat(), "amount": str(b.amount)},
    )


def _maybe_warn(b: Budget, *, agent: str) -> bool:
    """Raise ``budget-warning`` once per period when spent reaches ``warn_at`` of the amount;
    whether it did (``warned_period`` to save)."""
    if b.warned_period == b.period_start or b.spent < b.amount * b.warn_at:
        return False
    b.warned_period = b.period_start
    alert_raise(
        kind="budget-warning",
        agent=agent,
        model="*",
        message=(
            f"{_owner(b)} has spent {decimal_text(b.spent)} of its budget of "
            f"{decimal_text(b.amount)} per {b.period} (warns at {b.warn_at:.0%})"
        ),
        data={"budget": b.pk, "resets_at": _resets_at(b).isoformat(), "amount": str(b.amount)},
    )
    return True


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
    left = max(b.amount - b.spent - b.reserved, Decimal(0))
    refused = (
        f", under the {decimal_text(b.refused_estimate)} a call was estimated at"
        if b.refused_estimate is not None and b.refused_period == b.period_start
        else ""
    )
    return (
        f"budget: {_owner(b)}'s budget of {decimal_text(b.amount)} per {b.period} holds: spent "
        f"{decimal_text(b.spent)}, reserved {decimal_text(b.reserved)}, "
        f"{decimal_text(left)} left{refused}; an operator may raise it or release the hold"
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
        transaction.on_commit(holds_changed_here)
    return lifted
