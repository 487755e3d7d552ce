"""The breaker's pure decision core at every edge (architecture.md §7.2, §7.3)."""

from __future__ import annotations

from typing import Any

import pytest

from breaker.decision import BreakerAction, breaker_decide, probe_verdict

BASE: dict[str, Any] = dict(
    failure_type="invalid_request",
    http_status=400,
    sheds_this_run=0,
    shed_cap=3,
    probe_answered_this_run=False,
    rows_left=True,
)


@pytest.mark.parametrize("status", [400, 422, None])
def test_an_invalid_request_at_400_422_or_with_no_status_may_shed_and_probes_first(
    status: int | None,
) -> None:
    assert breaker_decide(**{**BASE, "http_status": status}) == BreakerAction.PROBE


@pytest.mark.parametrize(
    ("failure_type", "status"),
    [
        ("invalid_request", 401),
        ("invalid_request", 403),
        ("invalid_request", 404),
        ("invalid_request", 409),
        ("invalid_request", 413),
        ("invalid_request", 429),
        ("invalid_request", 500),
        ("invalid_request", 399),
        ("invalid_request", 421),
        ("invalid_request", 423),
        ("auth", 401),
        ("auth", None),
        ("context_length", 400),
        ("context_length", None),
        ("rate_limit", 429),
        ("rate_limit", None),
        ("server", 500),
        ("server", 400),
        ("timeout", None),
        ("not_found", 404),
        ("unknown", 400),
        ("unknown", None),
        ("", 400),
    ],
)
def test_every_other_failure_never_sheds(failure_type: str, status: int | None) -> None:
    for answered in (False, True):
        assert (
            breaker_decide(
                **{
                    **BASE,
                    "failure_type": failure_type,
                    "http_status": status,
                    "probe_answered_this_run": answered,
                }
            )
            == BreakerAction.NOTHING
        )


def test_a_failure_after_an_answered_probe_in_the_run_sheds_without_another_probe() -> None:
    assert breaker_decide(**{**BASE, "probe_answered_this_run": True}) == BreakerAction.SHED
    assert (
        breaker_decide(**{**BASE, "probe_answered_this_run": True, "sheds_this_run": 2})
        == BreakerAction.SHED
    )


@pytest.mark.parametrize(
    ("sheds", "expected"),
    [(2, BreakerAction.SHED), (3, BreakerAction.STOP_CAP), (4, BreakerAction.STOP_CAP)],
)
def test_the_shed_cap_stops_at_and_after_the_cap_but_not_one_below(
    sheds: int, expected: BreakerAction
) -> None:
    assert (
        breaker_decide(**{**BASE, "probe_answered_this_run": True, "sheds_this_run": sheds})
        == expected
    )


def test_the_cap_applies_even_before_a_probe_and_with_nothing_left() -> None:
    assert (
        breaker_decide(**{**BASE, "sheds_this_run": 3, "rows_left": False})
        == BreakerAction.STOP_CAP
    )


@pytest.mark.parametrize("answered", [False, True])
def test_nothing_left_to_shed_stops_instead_of_probing_or_shedding(answered: bool) -> None:
    assert (
        breaker_decide(**{**BASE, "rows_left": False, "probe_answered_this_run": answered})
        == BreakerAction.STOP_EMPTY
    )


def test_a_failure_that_may_not_shed_is_nothing_even_at_the_cap_or_when_empty() -> None:
    assert (
        breaker_decide(
            **{
                **BASE,
                "failure_type": "server",
                "http_status": 500,
                "sheds_this_run": 9,
                "rows_left": False,
            }
        )
        == BreakerAction.NOTHING
    )


VERDICT: dict[str, Any] = dict(failure_type="invalid_request", failure_status=400)


def test_an_answered_probe_is_answered_whatever_it_carries() -> None:
    assert (
        probe_verdict(**VERDICT, probe_outcome="answered", probe_type=None, probe_status=None)
        == "answered"
    )


@pytest.mark.parametrize(("failure_status",), [(400,), (422,), (None,)])
def test_a_probe_refused_with_the_failures_own_type_and_status_is_refused(
    failure_status: int | None,
) -> None:
    assert (
        probe_verdict(
            failure_type="invalid_request",
            failure_status=failure_status,
            probe_outcome="error",
            probe_type="invalid_request",
            probe_status=failure_status,
        )
        == "refused"
    )


@pytest.mark.parametrize(
    ("outcome", "probe_type", "status"),
    [
        ("error", "invalid_request", 422),  # same type, other status
        ("error", "invalid_request", None),  # same type, status missing
        ("error", "server", 400),  # same status, other type
        ("error", "rate_limit", 429),
        ("error", "invalid_request", 429),
        ("error", "auth", 401),
        ("error", None, None),
        ("deferred", "rate_limit", 429),
        ("deferred", None, None),
        ("cut", None, None),
        ("cut", "invalid_request", 400),
        ("aborted", None, None),
        ("aborted", "invalid_request", 400),
    ],
)
def test_any_other_probe_outcome_is_unclear(
    outcome: Any, probe_type: str | None, status: int | None
) -> None:
    assert (
        probe_verdict(**VERDICT, probe_outcome=outcome, probe_type=probe_type, probe_status=status)
        == "unclear"
    )


def test_a_status_present_on_the_probe_but_not_on_the_failure_is_unclear() -> None:
    assert (
        probe_verdict(
            failure_type="invalid_request",
            failure_status=None,
            probe_outcome="error",
            probe_type="invalid_request",
            probe_status=400,
        )
        == "unclear"
    )


@pytest.mark.parametrize(
    ("probe_type", "status"),
    [("rate_limit", None), ("rate_limit", 400), ("invalid_request", 429), ("server", 429)],
)
def test_a_rate_limited_probe_is_unclear_even_when_it_matches_the_failure(
    probe_type: str, status: int | None
) -> None:
    """A rate limit says nothing about the request's content: the rule holds on its own, not only
    because a sheddable failure is never a 429, so a probe failing exactly as the failure did is
    still unclear when that failure is a rate limit (either its type or its status)."""
    assert (
        probe_verdict(
            failure_type=probe_type,
            failure_status=status,
            probe_outcome="error",
            probe_type=probe_type,
            probe_status=status,
        )
        == "unclear"
    )
