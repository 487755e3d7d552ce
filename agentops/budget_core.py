"""The budgets' pure arithmetic (architecture.md §18): the calendar period a ledger counts, a
call's reservation estimate, and whether it fits. No database, no clock: ``agentops.budgets``
keeps the ledger on these."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

from agentops.prices import MTOK, Terms

PERIODS = ("day", "week", "month")

AMOUNT_MAX = Decimal(10) ** 18


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


@dataclass(frozen=True)
class Estimate:
    """What a call is likely to cost, margin included (``amount``, what it reserves), and the part
    its output bound alone accounts for (``output``: ``max_tokens`` times ``n``), which no
    shorter input can make fit."""

    amount: Decimal
    output: Decimal


def reservation_estimate(
    *, input_tokens: int, max_tokens: int, choices: int, terms: Terms, margin_percent: int
) -> Estimate:
    """A call's reservation: its input estimate at the input price plus ``max_tokens`` for each
    of its ``choices`` at the dearer of the output and reasoning prices (its output may all be
    reasoning), times ``1 + margin_percent/100``."""
    out = max(terms.output, terms.reasoning if terms.reasoning is not None else terms.output)
    scale = (100 + Decimal(margin_percent)) / 100
    q = Decimal("1e-12")
    output = (max_tokens * choices * out * scale / MTOK).quantize(q)
    return Estimate(
        amount=((input_tokens * terms.input * scale / MTOK) + output).quantize(q), output=output
    )


def fits(*, spent: Decimal, reserved: Decimal, more: Decimal, amount: Decimal) -> bool:
    return spent + reserved + more <= amount
