"""Where a provider's limit binds (architecture.md §6.12's wordings table, one test per
wording), the remaining-quota headers of both dialects (§6.13), and the seeds' acceleration
cooldown with its three release cases."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime

import pytest

from calls.classify import classify_frame, classify_http
from calls.limits import acceleration_cooldown, next_month_ms, quota_from_headers
from waits.core import EVERY_AGENT, EVERY_MODEL, Entry, WaitBook

NOW = 1_800_000_000_000.0


def openai(message: str, code: str, etype: str = "requests") -> str:
    return json.dumps({"error": {"message": message, "type": etype, "code": code}})


def anthropic(etype: str, message: str, **extra: object) -> str:
    return json.dumps({"type": "error", "error": {"type": etype, "message": message, **extra}})


# (status, body, scope, acceleration, until released)
WORDINGS = {
    "openai-org-rpm": (
        429,
        openai(
            "Rate limit reached for gpt-4o in organization org-abc on requests per min (RPM): "
            "Limit 500, Used 500, Requested 1.",
            "rate_limit_exceeded",
        ),
        "model",
    ),
    "openai-org-tpm": (
        429,
        openai(
            "Rate limit reached for gpt-4o-mini in organization org-abc on tokens per min "
            "(TPM): Limit 200000, Used 199000, Requested 2000.",
            "rate_limit_exceeded",
            "tokens",
        ),
        "model",
    ),
    "azure-deployment": (
        429,
        json.dumps(
            {
                "error": {
                    "code": "429",
                    "message": "Requests to the ChatCompletions_Create Operation under Azure "
                    "OpenAI API version 2024-02-01 have exceeded token rate limit of your "
                    "current OpenAI S0 pricing tier.",
                }
            }
        ),
        "model",
    ),
    "anthropic-org": (
        429,
        anthropic(
            "rate_limit_error",
            "This request would exceed the rate limit for your organization (abc) of 50,000 "
            "input tokens per minute.",
        ),
        "model",
    ),
    "gemini-resource-exhausted": (
        429,
        json.dumps(
            {
                "error": {
                    "code": 429,
                    "status": "RESOURCE_EXHAUSTED",
                    "message": "Quota exceeded for metric: generativelanguage.googleapis.com/"
                    "generate_content_free_tier_requests, limit: 15, model: gemini-2.0-flash",
                }
            }
        ),
        "model",
    ),
    "openai-insufficient-quota": (
        429,
        openai("You exceeded your current quota.", "insufficient_quota", "insufficient_quota"),
        "provider",
    ),
    "openai-credit-balance": (
        429,
        openai("Your credit balance is too low.", "credit_balance_exhausted", "billing"),
        "provider",
    ),
    "openai-org-usage-limit": (
        429,
        openai("Usage limit reached.", "organization_usage_limit_exceeded", "billing"),
        "provider",
    ),
    "openai-org-spend-limit": (
        429,
        openai("Spend limit reached.", "organization_spend_limit_exceeded", "billing"),
        "provider",
    ),
    "openai-project-spend-limit": (
        429,
        openai("Project spend limit reached.", "project_spend_limit_exceeded", "billing"),
        "provider",
    ),
    "anthropic-spend-cap": (
        429,
        anthropic(
            "rate_limit_error",
            "Monthly usage limit reached.",
            details={"error_code": "enforced_spend_limit_reached"},
        ),
        "provider",
    ),
    "anthropic-usage-limits-400": (
        400,
        anthropic(
            "invalid_request_error",
            "You have reached your specified API usage limits. You will regain access on "
            "2027-01-01 at 00:00 UTC.",
        ),
        "provider",
    ),
    "acceleration": (
        429,
        anthropic(
            "rate_limit_error",
            "This request would exceed your organization's acceleration limit.",
        ),
        "provider",
    ),
    "a-plain-429-stays-the-agents": (
        429,
        openai("Too many requests, slow down.", "rate_limit_exceeded"),
        "agent",
    ),
}


@pytest.mark.parametrize("case", list(WORDINGS))
def test_each_wording_binds_at_the_scope_the_provider_states(case: str) -> None:
    status, body, scope = WORDINGS[case]
    error = classify_http(status, {}, body, NOW)
    assert error.scope == scope
    assert error.acceleration is (case == "acceleration")
    if case.startswith(
        (
            "openai-insufficient",
            "openai-credit",
            "openai-org-usage",
            "openai-org-spend",
            "openai-project",
            "anthropic-usage",
        )
    ):
        assert error.type == "quota" and error.retry_after_ms == math.inf  # until released
    if case == "anthropic-spend-cap":
        # Until 00:00 UTC on the first of the next month, unless a wait is stated.
        assert error.type == "quota" and error.retry_after_ms is not None
        assert NOW + error.retry_after_ms == next_month_ms(NOW)
        assert datetime.fromtimestamp(next_month_ms(NOW) / 1000, UTC).day == 1


def test_a_429_whose_headers_say_nothing_is_left_binds_the_model_until_their_reset() -> None:
    headers = {
        "x-ratelimit-limit-requests": "2",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1.5s",
    }
    error = classify_http(429, headers, openai("Too many requests", "rate_limit_exceeded"), NOW)
    assert (error.scope, error.retry_after_ms) == ("model", 1500)


def test_a_non_retryable_failure_worded_as_acceleration_keeps_its_terminal_disposition() -> None:
    error = classify_http(
        400,
        {},
        anthropic("invalid_request_error", "acceleration limit: your request is malformed"),
        NOW,
    )
    assert (error.type, error.scope, error.acceleration) == ("invalid_request", "agent", False)


def test_a_stream_error_frame_worded_as_an_organization_limit_binds_the_model() -> None:
    frame = {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "This request would exceed the rate limit for your organization.",
        },
    }
    assert classify_frame(frame, NOW).scope == "model"


MODEL_LIMIT = openai(
    "Rate limit reached for gpt-4o in organization org-abc on requests per min (RPM): "
    "Limit 500, Used 500, Requested 1.",
    "rate_limit_exceeded",
)
SPEND_CAP = anthropic(
    "rate_limit_error",
    "Monthly usage limit reached.",
    details={"error_code": "enforced_spend_limit_reached"},
)


def test_a_model_limit_stays_a_retryable_rate_limit_at_the_services_pacing_without_a_wait() -> None:
    error = classify_http(429, {}, MODEL_LIMIT, NOW)
    assert (error.type, error.retryable, error.scope) == ("rate_limit", True, "model")
    assert error.retry_after_ms is None  # no stated wait and no headers: the service's pacing


def test_a_model_limits_stated_wait_is_kept_over_its_headers_reset() -> None:
    headers = {
        "retry-after": "30",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1.5s",
    }
    error = classify_http(429, headers, MODEL_LIMIT, NOW)
    assert (error.scope, error.retry_after_ms) == ("model", 30_000)


def test_a_429_whose_headers_say_no_tokens_are_left_waits_for_the_tokens_reset() -> None:
    headers = {
        "x-ratelimit-remaining-requests": "12",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "6m0s",
    }
    error = classify_http(429, headers, openai("Too many requests", "rate_limit_exceeded"), NOW)
    assert (error.scope, error.retry_after_ms) == ("model", 360_000)


def test_a_reset_already_past_by_the_providers_clock_is_no_wait() -> None:
    headers = {
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2027-01-15T07:59:58Z",  # 2 s before NOW
    }
    error = classify_http(429, headers, anthropic("rate_limit_error", "Too many requests"), NOW)
    assert (error.scope, error.retry_after_ms) == ("model", 0.0)


def test_headers_that_say_nothing_is_left_but_not_when_bind_the_model_at_the_services_pacing() -> (
    None
):
    headers = {"x-ratelimit-remaining-requests": "0"}
    error = classify_http(429, headers, openai("Too many requests", "rate_limit_exceeded"), NOW)
    assert (error.scope, error.retry_after_ms) == ("model", None)


def test_a_plain_429_whose_headers_say_some_is_left_stays_the_agents_without_a_wait() -> None:
    headers = {
        "x-ratelimit-remaining-requests": "5",
        "x-ratelimit-reset-requests": "10s",
        "x-ratelimit-remaining-tokens": "9000",
        "x-ratelimit-reset-tokens": "10s",
    }
    error = classify_http(429, headers, openai("Too many requests", "rate_limit_exceeded"), NOW)
    assert (error.type, error.scope, error.retry_after_ms) == ("rate_limit", "agent", None)


def test_a_spend_cap_that_states_a_wait_holds_the_account_that_long_not_to_the_month() -> None:
    error = classify_http(429, {"retry-after": "3600"}, SPEND_CAP, NOW)
    assert (error.type, error.scope, error.retry_after_ms) == ("quota", "provider", 3_600_000)
    credit = classify_http(
        429,
        {"retry-after": "60"},
        openai("You exceeded your current quota.", "insufficient_quota", "insufficient_quota"),
        NOW,
    )
    assert (credit.type, credit.scope, credit.retry_after_ms) == ("quota", "provider", 60_000)


def test_a_spend_cap_in_a_stream_error_frame_holds_the_account_until_the_next_month() -> None:
    error = classify_frame(json.loads(SPEND_CAP), NOW)
    assert (error.type, error.scope, error.http_status) == ("quota", "provider", 429)
    assert error.retry_after_ms is not None
    assert NOW + error.retry_after_ms == next_month_ms(NOW)


def test_a_quota_refusal_worded_as_the_models_limit_binds_the_model() -> None:
    # Not a spent credit: a per-model quota, which every agent on the model meets alike.
    body = openai(
        "Quota exceeded for metric: generativelanguage.googleapis.com/"
        "generate_content_free_tier_requests, limit: 15, model: gemini-2.0-flash",
        "quota_exceeded",
        "quota_exceeded",
    )
    error = classify_http(429, {}, body, NOW)
    assert (error.type, error.scope) == ("quota", "model")


def test_a_spend_type_behind_a_gateways_status_code_holds_the_account() -> None:
    # A gateway that puts the status in ``code`` and keeps the provider's type beside it.
    body = json.dumps(
        {
            "error": {
                "message": "litellm.RateLimitError: You exceeded your current quota.",
                "type": "insufficient_quota",
                "param": None,
                "code": "429",
            }
        }
    )
    error = classify_http(429, {}, body, NOW)
    assert (error.type, error.scope, error.retry_after_ms) == ("quota", "provider", math.inf)


@pytest.mark.parametrize(
    ("value", "ms"),
    [("1s", 1000), ("6m0s", 360_000), ("20ms", 20), ("1h2m3.5s", 3_723_500), ("0.25", 250)],
)
def test_openai_resets_read_as_durations(value: str, ms: float) -> None:
    quota = quota_from_headers(
        {"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": value}, NOW
    )
    assert quota is not None and quota.requests_reset_ms == NOW + ms


def test_anthropic_headers_read_with_rfc3339_resets_and_the_scarcest_tokens() -> None:
    quota = quota_from_headers(
        {
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "49",
            "anthropic-ratelimit-requests-reset": "2027-01-15T08:00:30Z",
            "anthropic-ratelimit-input-tokens-remaining": "900",
            "anthropic-ratelimit-input-tokens-limit": "40000",
            "anthropic-ratelimit-input-tokens-reset": "2027-01-15T08:00:10Z",
            "anthropic-ratelimit-output-tokens-remaining": "7000",
        },
        NOW,
    )
    assert quota is not None
    assert (quota.requests_limit, quota.requests_remaining) == (50, 49)
    assert quota.requests_reset_ms == datetime(2027, 1, 15, 8, 0, 30, tzinfo=UTC).timestamp() * 1000
    assert (quota.tokens_remaining, quota.tokens_limit) == (900, 40000)


def test_an_answer_without_quota_headers_has_no_quota() -> None:
    assert quota_from_headers({"content-type": "application/json"}, NOW) is None


# --- the acceleration cooldown (the seeds' rules) -------------------------------------------


def test_the_cooldown_is_the_services_own_pacing_or_a_longer_stated_wait() -> None:
    own = acceleration_cooldown(
        now_ms=NOW, stated_ms=None, own_ms=65_000, jitter_ms=5_000, jitter=0.5
    )
    assert (own.until, own.lengthened) == (NOW + 67_500, False)
    long = acceleration_cooldown(
        now_ms=NOW, stated_ms=7_200_000, own_ms=65_000, jitter_ms=5_000, jitter=0.0
    )
    assert (long.until, long.own_until, long.lengthened) == (NOW + 7_200_000, NOW + 65_000, True)
    # Only the service's own default is capped at 10 minutes; a stated wait is not.
    capped = acceleration_cooldown(
        now_ms=NOW, stated_ms=None, own_ms=3_600_000, jitter_ms=0, jitter=0.0
    )
    assert capped.until == NOW + 600_000


def test_a_negative_stated_wait_counts_as_zero_the_one_second_floor_plus_jitter() -> None:
    for stated in (-1.0, -1000.0, 0.0, -1e20):
        cooldown = acceleration_cooldown(
            now_ms=NOW, stated_ms=stated, own_ms=65_000, jitter_ms=5_000, jitter=0.2
        )
        assert cooldown.until == NOW + 1_000 + 1_000


def _cooldown_book(lengthened_by: str) -> WaitBook:
    book = WaitBook()
    book.apply(
        Entry(
            kind="set",
            agent=EVERY_AGENT,
            model=EVERY_MODEL,
            until=int(NOW + 7_200_000),
            reason="acceleration",
            at=NOW,
            provider="p",
            own_until=int(NOW + 65_000),
            lengthened_by=lengthened_by,
        )
    )
    return book


def _release(book: WaitBook, model: str) -> int | None:
    book.apply(Entry(kind="release", agent=EVERY_AGENT, model=model, provider="p"))
    wait = book.lookup(EVERY_AGENT, EVERY_MODEL, "p")
    assert wait is not None  # the service's own pacing is never released
    return wait.until


def test_a_release_covering_the_lengthening_model_shortens_the_cooldown_to_own_pacing() -> None:
    assert _release(_cooldown_book("gpt-x"), "gpt-x") == NOW + 65_000
    assert _release(_cooldown_book("gpt-x"), EVERY_MODEL) == NOW + 65_000


def test_a_release_of_another_model_leaves_the_cooldown_as_it_was() -> None:
    assert _release(_cooldown_book("gpt-x"), "gpt-y") == NOW + 7_200_000


def test_a_release_never_lengthens_the_cooldown() -> None:
    book = WaitBook()
    book.apply(
        Entry(
            kind="set",
            agent=EVERY_AGENT,
            model=EVERY_MODEL,
            until=int(NOW + 30_000),
            reason="acceleration",
            at=NOW,
            provider="p",
            own_until=int(NOW + 65_000),
            lengthened_by="gpt-x",
        )
    )
    assert _release(book, "gpt-x") == NOW + 30_000


def test_an_operators_hold_is_lifted_by_its_own_lift_never_by_a_release() -> None:
    book = WaitBook()
    book.apply(
        Entry(
            kind="hold",
            agent=EVERY_AGENT,
            model=EVERY_MODEL,
            until=None,
            reason="maintenance",
            at=NOW,
            provider="p",
            ref="h1",
        )
    )
    book.apply(Entry(kind="release", agent=EVERY_AGENT, model=EVERY_MODEL, provider="p"))
    book.apply(Entry(kind="release", agent="a", model=EVERY_MODEL))
    held = book.binding_on(agent="a", model="m", provider="", provider_name="p", now_ms=NOW)
    assert held is not None and held.ref == "h1"
    book.apply(Entry(kind="lift", agent="", model="", ref="h1"))
    assert book.binding_on(agent="a", model="m", provider="", provider_name="p", now_ms=NOW) is None


def test_an_agents_call_is_bound_by_the_longest_of_its_own_the_models_and_the_accounts() -> None:
    book = WaitBook()
    for agent, model, until in (
        ("a", "m", NOW + 1_000),
        (EVERY_AGENT, "m", NOW + 5_000),
        (EVERY_AGENT, EVERY_MODEL, NOW + 3_000),
    ):
        book.apply(
            Entry(
                kind="set",
                agent=agent,
                model=model,
                until=int(until),
                reason="r",
                at=NOW,
                provider="" if agent == "a" else "p",
            )
        )
    found = book.binding_on(agent="a", model="m", provider="", provider_name="p", now_ms=NOW)
    assert found is not None and found.until == NOW + 5_000 and found.scope == "model"
    other = book.binding_on(agent="b", model="n", provider="", provider_name="p", now_ms=NOW)
    assert other is not None and other.scope == "provider"
    elsewhere = book.binding_on(agent="b", model="m", provider="", provider_name="q", now_ms=NOW)
    assert elsewhere is None
    # Releasing the agent's own wait leaves the scoped ones.
    book.apply(Entry(kind="release", agent="a", model=EVERY_MODEL))
    kept = book.binding_on(agent="a", model="m", provider="", provider_name="p", now_ms=NOW)
    assert kept is not None and kept.scope == "model"
