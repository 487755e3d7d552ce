"""A budget as the API reads and writes it (architecture.md §18, API.md): a ``PUT .../budget``
body checked field by field, the budget set (its ledger started or kept), and the ledger as
``GET .../budget`` shows it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction

from agentops.budget_core import AMOUNT_MAX, PERIODS, period_bounds
from agentops.budgets import holds_changed_here, period_rolled
from agentops.exceptions import bad_field
from agentops.models import Agent, Budget, Project
from agentops.prices import decimal_amount, decimal_text


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
            b.ledger += 1
        b.amount, b.period, b.warn_at = amount, period, warn_at
        if b.pk is not None:
            period_rolled(b, now)
        if b.held_period == b.period_start and b.spent + b.reserved < amount:
            b.held_period = None
        b.released_period = None  # a budget set again is enforced again
        b.save()
        transaction.on_commit(holds_changed_here)
        return b


def budget_out(b: Budget, now: datetime) -> dict[str, Any]:
    """As API.md shapes it: the ledger of the period in force at ``now``, the room left and the
    estimate of the last call it refused this period."""
    start, resets = period_bounds(b.period, now, settings.AGENTOPS_BUDGET_TIME_ZONE)
    current = start == b.period_start
    spent = b.spent if current else Decimal(0)
    reserved = b.reserved if current else Decimal(0)
    refused = b.refused_estimate if current and b.refused_period == b.period_start else None
    return {
        "amount": decimal_text(b.amount),
        "period": b.period,
        "warn_at": float(b.warn_at),
        "spent": decimal_text(spent),
        "reserved": decimal_text(reserved),
        "left": decimal_text(max(b.amount - spent - reserved, Decimal(0))),
        "refused_estimate": decimal_text(refused) if refused is not None else None,
        "held": current and b.held_period == b.period_start,
        "resets_at": resets,
    }
