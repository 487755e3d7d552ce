"""The pure retry decision: what an answer means, the backoff, retry-after."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest

from agentops.webhooks.retry import Next, Verdict, attempt_verdict, backoff_ms, retry_after_ms

NOW = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)


def verdict(
    status: int | None, *, attempt: int = 1, retry_after: str | None = None, jitter: float = 0.0
) -> tuple[Next, float | None]:
    v = attempt_verdict(
        status_code=status,
        error="ConnectError" if status is None else "",
        retry_after=retry_after,
        attempt=attempt,
        max_attempts=5,
        base_ms=1000,
        max_ms=60_000,
        jitter=jitter,
        now=NOW,
    )
    return v.next, v.delay_ms


@pytest.mark.parametrize("status", [200, 201, 204, 299])
def test_any_2xx_delivers(status: int) -> None:
    assert verdict(status) == (Next.DELIVERED, None)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 499])
def test_a_4xx_other_than_408_and_429_fails_without_retry(status: int) -> None:
    assert verdict(status) == (Next.FAIL, None)


def test_a_410_disables_the_endpoint() -> None:
    assert verdict(410) == (Next.DISABLE, None)


def test_a_redirect_is_not_followed_and_not_retried() -> None:
    assert verdict(301) == (Next.FAIL, None)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, None])
def test_408_429_5xx_and_no_answer_are_retried_until_the_attempts_run_out(
    status: int | None,
) -> None:
    assert verdict(status, attempt=4) == (Next.RETRY, 8000)
    assert verdict(status, attempt=5) == (Next.GIVE_UP, None)


def test_backoff_doubles_is_capped_and_jitter_adds_up_to_half() -> None:
    assert [
        backoff_ms(attempt=n, base_ms=1000, max_ms=60_000, jitter=0) for n in (1, 2, 3, 7, 8)
    ] == [1000, 2000, 4000, 60_000, 60_000]
    assert backoff_ms(attempt=2, base_ms=1000, max_ms=60_000, jitter=0.999) == pytest.approx(2999)
    assert (
        backoff_ms(attempt=7, base_ms=1000, max_ms=60_000, jitter=0.999) == 60_000
    )  # the cap holds with jitter
    assert backoff_ms(attempt=10_000, base_ms=1000, max_ms=60_000, jitter=0) == 60_000


def test_retry_after_is_a_floor_on_the_delay_up_to_the_cap() -> None:
    assert verdict(429, retry_after="30") == (Next.RETRY, 30_000)
    assert verdict(503, retry_after="0") == (Next.RETRY, 1000)  # never sooner than the backoff
    assert verdict(429, retry_after="86400") == (Next.RETRY, 60_000)  # capped


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert retry_after_ms("120", now=NOW) == 120_000
    assert retry_after_ms(" 1.5 ", now=NOW) == 1500
    assert (
        retry_after_ms(format_datetime(NOW + timedelta(seconds=90), usegmt=True), now=NOW) == 90_000
    )
    assert retry_after_ms(format_datetime(NOW - timedelta(seconds=90), usegmt=True), now=NOW) == 0
    assert retry_after_ms("-5", now=NOW) == 0  # a wait in the past means now, as a past date does
    for unreadable in (None, "", "soon", "nan", "inf", "Mon, 99 Foo 2025"):
        assert retry_after_ms(unreadable, now=NOW) is None


@pytest.mark.parametrize("zone", [" -0000", ""])
def test_an_http_date_without_a_time_zone_is_read_as_gmt_as_inference_reads_it(zone: str) -> None:
    from calls.classify import stated_wait_ms

    header = "Wed, 01 Jan 2025 12:01:30" + zone  # NOW + 90 s, GMT
    assert retry_after_ms(header, now=NOW) == 90_000
    assert stated_wait_ms({"retry-after": header}, None, NOW.timestamp() * 1000) == 90_000


def test_a_retry_countdown_is_cut_to_half_the_brokers_visibility_timeout(settings: Any) -> None:
    from agentops.celery import task_countdown_s

    half = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] / 2
    assert task_countdown_s(half - 1) == half - 1
    assert task_countdown_s(half) == half
    assert task_countdown_s(half + 1) == half


def test_an_unreadable_retry_after_falls_back_to_the_backoff() -> None:
    assert verdict(429, retry_after="later") == (Next.RETRY, 1000)


# The reason is what the attempt's last error, the endpoint's disabled reason and the log say.
@pytest.mark.parametrize(
    ("status", "error", "attempt", "expected"),
    [
        pytest.param(200, "", 1, Verdict(Next.DELIVERED, "HTTP 200"), id="200"),
        pytest.param(299, "", 1, Verdict(Next.DELIVERED, "HTTP 299"), id="299"),
        pytest.param(
            300,
            "",
            1,
            Verdict(
                Next.FAIL,
                "HTTP 300: redirects are not followed; point the endpoint at the final URL",
            ),
            id="300",
        ),
        pytest.param(
            399,
            "",
            1,
            Verdict(
                Next.FAIL,
                "HTTP 399: redirects are not followed; point the endpoint at the final URL",
            ),
            id="399",
        ),
        pytest.param(
            400,
            "",
            1,
            Verdict(Next.FAIL, "HTTP 400: the receiver refused the message; not retried"),
            id="400",
        ),
        pytest.param(
            410,
            "",
            1,
            Verdict(
                Next.DISABLE,
                "HTTP 410 Gone: the receiver says this endpoint is gone; it was disabled",
            ),
            id="410",
        ),
        pytest.param(
            499,
            "",
            1,
            Verdict(Next.FAIL, "HTTP 499: the receiver refused the message; not retried"),
            id="499",
        ),
        pytest.param(
            500, "", 1, Verdict(Next.RETRY, "HTTP 500; retrying", delay_ms=1000), id="500"
        ),
        pytest.param(
            429, "", 5, Verdict(Next.GIVE_UP, "HTTP 429; gave up after 5 attempt(s)"), id="429-last"
        ),
        pytest.param(
            None,
            "ConnectError",
            1,
            Verdict(Next.RETRY, "ConnectError; retrying", delay_ms=1000),
            id="no-answer",
        ),
        pytest.param(
            None,
            "",
            1,
            Verdict(Next.RETRY, "no answer; retrying", delay_ms=1000),
            id="no-answer-unnamed",
        ),
        pytest.param(
            None,
            "ReadTimeout",
            6,
            Verdict(Next.GIVE_UP, "ReadTimeout; gave up after 6 attempt(s)"),
            id="no-answer-past-the-last",
        ),
    ],
)
def test_each_verdict_says_why(
    status: int | None, error: str, attempt: int, expected: Verdict
) -> None:
    assert (
        attempt_verdict(
            status_code=status,
            error=error,
            attempt=attempt,
            max_attempts=5,
            base_ms=1000,
            max_ms=60_000,
            jitter=0.0,
            now=NOW,
        )
        == expected
    )


def test_without_an_error_named_no_answer_says_so() -> None:
    v = attempt_verdict(
        status_code=None,
        attempt=1,
        max_attempts=5,
        base_ms=1000,
        max_ms=60_000,
        jitter=0.0,
        now=NOW,
    )
    assert v.reason == "no answer; retrying"


def test_a_retry_after_counts_only_on_an_answer() -> None:
    """With no answer there are no headers to read; a retry-after passed anyway is not a floor."""
    v = attempt_verdict(
        status_code=None,
        error="ConnectError",
        retry_after="30",
        attempt=1,
        max_attempts=5,
        base_ms=1000,
        max_ms=60_000,
        jitter=0.0,
        now=NOW,
    )
    assert v == Verdict(Next.RETRY, "ConnectError; retrying", delay_ms=1000)
