"""The budgets' pure arithmetic (``agentops.budget_core``, architecture.md §18): calendar
periods in a time zone, a call's reservation estimate, and whether it fits. No database."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from agentops.budget_core import AMOUNT_MAX, PERIODS, fits, period_bounds, reservation_estimate
from agentops.prices import Terms

TERMS = Terms(
    id=1,
    input=Decimal("3"),
    output=Decimal("15"),
    cached_input=None,
    reasoning=None,
    currency="USD",
    effective_from=datetime(2026, 1, 1, tzinfo=UTC),
)


def test_a_day_runs_from_local_midnight_to_local_midnight() -> None:
    at = datetime(2026, 3, 29, 0, 30, 45, 123456, tzinfo=UTC)
    assert period_bounds("day", at, "UTC") == (
        datetime(2026, 3, 29, tzinfo=UTC),
        datetime(2026, 3, 30, tzinfo=UTC),
    )
    # 00:30 UTC is already the 29th in Tokyo, and still the 28th in New York.
    start, end = period_bounds("day", at, "Asia/Tokyo")
    assert (start, end) == (
        datetime(2026, 3, 28, 15, tzinfo=UTC),
        datetime(2026, 3, 29, 15, tzinfo=UTC),
    )
    start, _ = period_bounds("day", at, "America/New_York")
    assert start == datetime(2026, 3, 28, 4, tzinfo=UTC)


def test_a_dst_day_is_23_or_25_hours_long() -> None:
    spring = period_bounds("day", datetime(2026, 3, 29, 12, tzinfo=UTC), "Europe/Paris")
    assert spring == (datetime(2026, 3, 28, 23, tzinfo=UTC), datetime(2026, 3, 29, 22, tzinfo=UTC))
    start, end = period_bounds("day", datetime(2026, 10, 25, 12, tzinfo=UTC), "Europe/Paris")
    assert (start.astimezone(UTC), end.astimezone(UTC)) == (
        datetime(2026, 10, 24, 22, tzinfo=UTC),
        datetime(2026, 10, 25, 23, tzinfo=UTC),
    )


def test_a_week_starts_on_monday_and_a_month_on_its_first() -> None:
    sunday = datetime(2026, 3, 29, 23, 59, tzinfo=UTC)
    assert period_bounds("week", sunday, "UTC") == (
        datetime(2026, 3, 23, tzinfo=UTC),
        datetime(2026, 3, 30, tzinfo=UTC),
    )
    monday = datetime(2026, 3, 30, tzinfo=UTC)
    assert period_bounds("week", monday, "UTC")[0] == monday
    assert period_bounds("month", datetime(2026, 12, 31, 23, 59, tzinfo=UTC), "UTC") == (
        datetime(2026, 12, 1, tzinfo=UTC),
        datetime(2027, 1, 1, tzinfo=UTC),
    )
    assert period_bounds("month", datetime(2026, 1, 31, tzinfo=UTC), "UTC")[1] == datetime(
        2026, 2, 1, tzinfo=UTC
    )
    assert period_bounds("month", datetime(2026, 2, 1, tzinfo=UTC), "UTC")[0] == datetime(
        2026, 2, 1, tzinfo=UTC
    )


def test_a_period_not_known_is_refused_by_name() -> None:
    assert PERIODS == ("day", "week", "month")
    with pytest.raises(ValueError, match=r"period must be one of .* not 'year'"):
        period_bounds("year", datetime(2026, 1, 1, tzinfo=UTC), "UTC")


def test_the_estimate_is_input_and_every_choices_output_with_the_margin() -> None:
    one = reservation_estimate(
        input_tokens=1000, max_tokens=100, choices=1, terms=TERMS, margin_percent=25
    )
    assert one.amount == Decimal("0.005625")  # (1000 x 3 + 100 x 15) x 1.25, per million
    assert one.output == Decimal("0.001875")
    ten = reservation_estimate(
        input_tokens=1000, max_tokens=100, choices=10, terms=TERMS, margin_percent=25
    )
    assert (ten.amount, ten.output) == (Decimal("0.02250"), Decimal("0.01875"))
    bare = reservation_estimate(
        input_tokens=1000, max_tokens=100, choices=1, terms=TERMS, margin_percent=0
    )
    assert (bare.amount, bare.output) == (Decimal("0.0045"), Decimal("0.0015"))


def test_output_is_reserved_at_the_dearer_of_output_and_reasoning() -> None:
    dear = Terms(**{**TERMS.__dict__, "reasoning": Decimal("60")})
    assert reservation_estimate(
        input_tokens=0, max_tokens=1000, choices=1, terms=dear, margin_percent=0
    ).output == Decimal("0.06")
    cheap = Terms(**{**TERMS.__dict__, "reasoning": Decimal("1")})
    assert reservation_estimate(
        input_tokens=0, max_tokens=1000, choices=1, terms=cheap, margin_percent=0
    ).output == Decimal("0.015")


def test_the_estimate_keeps_twelve_places_and_no_more() -> None:
    tiny = Terms(**{**TERMS.__dict__, "input": Decimal("0.000001"), "output": Decimal("0.000003")})
    est = reservation_estimate(
        input_tokens=1, max_tokens=1, choices=1, terms=tiny, margin_percent=0
    )
    assert (est.amount, est.output) == (Decimal("4E-12"), Decimal("3E-12"))
    thirds = reservation_estimate(
        input_tokens=1, max_tokens=0, choices=1, terms=TERMS, margin_percent=1
    )
    assert thirds.amount == Decimal("0.000003030000")


def test_a_call_fits_up_to_the_amount_exactly() -> None:
    assert fits(spent=Decimal(1), reserved=Decimal(1), more=Decimal(2), amount=Decimal(4))
    assert not fits(
        spent=Decimal(1), reserved=Decimal(1), more=Decimal("2.000000000001"), amount=Decimal(4)
    )
    assert not fits(spent=Decimal(0), reserved=Decimal(3), more=Decimal(2), amount=Decimal(4))
    assert not fits(spent=Decimal(3), reserved=Decimal(0), more=Decimal(2), amount=Decimal(4))
    assert AMOUNT_MAX == Decimal(10) ** 18
