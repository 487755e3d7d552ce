"""Classifying provider failures and reading the stated wait (architecture.md §5.6)."""

from __future__ import annotations

import json
import math
import ssl
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

import aiohttp
import pytest
from aiohttp.client_reqrep import ConnectionKey

from agentops.text import bound_text
from calls.classify import (
    classify_exception,
    classify_frame,
    classify_http,
    paced_error,
    project_limit_error,
    protocol_error,
    stated_wait_ms,
)
from calls.limits import SPEND_CODES
from calls.types import ProviderError

NOW = 1_700_000_000_000.0  # a whole second, so HTTP dates (second resolution) land exactly


def http_date(offset_s: float) -> str:
    return format_datetime(datetime.fromtimestamp(NOW / 1000 + offset_s, UTC), usegmt=True)


def openai_body(message: str, type_: str | None, code: str | None, **extra: Any) -> str:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": None, "code": code, **extra}}
    )


def anthropic_body(type_: str, message: str, **extra: Any) -> str:
    return json.dumps({"type": "error", "error": {"type": type_, "message": message, **extra}})


# (status, body, type, retryable, provider_code)
STATUS_CASES = [
    pytest.param(
        429,
        openai_body("Rate limit reached", "requests", "rate_limit_exceeded"),
        "rate_limit",
        True,
        "rate_limit_exceeded",
        id="429-openai-rate-limit",
    ),
    pytest.param(
        429,
        anthropic_body("rate_limit_error", "Number of requests exceeded"),
        "rate_limit",
        True,
        "rate_limit_error",
        id="429-anthropic-rate-limit",
    ),
    pytest.param(
        429,
        openai_body("Quota exceeded, slow down", "requests", "rate_limit_exceeded"),
        "rate_limit",
        True,
        "rate_limit_exceeded",
        id="429-quota-in-message-only-is-rate-limit",
    ),
    pytest.param(
        429,
        openai_body("You exceeded your current quota", "insufficient_quota", "insufficient_quota"),
        "quota",
        False,
        "insufficient_quota",
        id="429-insufficient-quota",
    ),
    pytest.param(
        429,
        openai_body("Billing hard limit", "requests", "billing_hard_limit_reached"),
        "quota",
        False,
        "billing_hard_limit_reached",
        id="429-billing-code",
    ),
    pytest.param(429, "", "rate_limit", True, None, id="429-no-body"),
    pytest.param(
        408,
        openai_body("Request timed out", "invalid_request_error", None),
        "timeout",
        True,
        "invalid_request_error",
        id="408",
    ),
    pytest.param(
        401,
        openai_body("Incorrect API key", "invalid_request_error", "invalid_api_key"),
        "auth",
        False,
        "invalid_api_key",
        id="401",
    ),
    pytest.param(
        402,
        anthropic_body("billing_error", "Your credit balance is too low"),
        "auth",
        False,
        "billing_error",
        id="402",
    ),
    pytest.param(
        403,
        anthropic_body("permission_error", "Not allowed"),
        "auth",
        False,
        "permission_error",
        id="403",
    ),
    pytest.param(
        413,
        anthropic_body("request_too_large", "Request exceeds the maximum size"),
        "context_length",
        False,
        "request_too_large",
        id="413",
    ),
    pytest.param(
        400,
        openai_body(
            "This model's maximum context length is 128000 tokens.",
            "invalid_request_error",
            "context_length_exceeded",
        ),
        "context_length",
        False,
        "context_length_exceeded",
        id="400-openai-context-code",
    ),
    pytest.param(
        400,
        openai_body("This model's maximum context length is 8192 tokens.", None, None),
        "context_length",
        False,
        None,
        id="400-context-message-only",
    ),
    pytest.param(
        400,
        anthropic_body(
            "invalid_request_error", "prompt is too long: 201873 tokens > 200000 maximum"
        ),
        "context_length",
        False,
        "invalid_request_error",
        id="400-anthropic-prompt-too-long",
    ),
    pytest.param(
        400,
        openai_body("Your input exceeds the context window of this model", None, None),
        "context_length",
        False,
        None,
        id="400-context-window-message",
    ),
    pytest.param(
        400,
        openai_body(
            "temperature is not supported", "invalid_request_error", "unsupported_parameter"
        ),
        "invalid_request",
        False,
        "unsupported_parameter",
        id="400-other",
    ),
    pytest.param(
        400,
        openai_body("Flagged", "invalid_request_error", "content_policy_violation"),
        "policy",
        False,
        "content_policy_violation",
        id="400-content-policy",
    ),
    pytest.param(
        404,
        openai_body("The model does not exist", "invalid_request_error", "model_not_found"),
        "invalid_request",
        False,
        "model_not_found",
        id="404",
    ),
    pytest.param(
        422,
        openai_body("Unprocessable", "invalid_request_error", None),
        "invalid_request",
        False,
        "invalid_request_error",
        id="422",
    ),
    pytest.param(
        500,
        openai_body("The server had an error", "server_error", None),
        "server",
        True,
        "server_error",
        id="500",
    ),
    pytest.param(502, "<html>Bad gateway</html>", "server", True, None, id="502-html"),
    pytest.param(
        503,
        anthropic_body("api_error", "Service unavailable"),
        "server",
        True,
        "api_error",
        id="503",
    ),
    pytest.param(504, "", "server", True, None, id="504-empty"),
    pytest.param(
        529,
        anthropic_body("overloaded_error", "Overloaded"),
        "overloaded",
        True,
        "overloaded_error",
        id="529",
    ),
    pytest.param(
        404,
        openai_body("This model's maximum context length is 8192 tokens.", None, None),
        "context_length",
        False,
        None,
        id="404-context-message",
    ),
    pytest.param(
        422,
        openai_body("Input is too long for this model", None, None),
        "context_length",
        False,
        None,
        id="422-context-message",
    ),
    pytest.param(
        422,
        openai_body("Flagged", None, "content_filter"),
        "policy",
        False,
        "content_filter",
        id="422-content-filter",
    ),
    pytest.param(
        404,
        openai_body("Flagged", None, "content_filter"),
        "invalid_request",
        False,
        "content_filter",
        id="404-content-filter-is-not-policy",
    ),
    pytest.param(529, "", "overloaded", True, None, id="529-no-body"),
    pytest.param(
        503,
        anthropic_body("overloaded_error", "Overloaded"),
        "overloaded",
        True,
        "overloaded_error",
        id="503-overloaded-code",
    ),
    pytest.param(599, "", "server", True, None, id="599-server"),
    pytest.param(600, "", "unknown", False, None, id="600-unknown"),
    pytest.param(418, "I'm a teapot", "unknown", False, None, id="418-unknown"),
    pytest.param(302, "", "unknown", False, None, id="302-unknown"),
]


@pytest.mark.parametrize(("status", "body", "kind", "retryable", "code"), STATUS_CASES)
def test_each_http_status_maps_to_its_type_and_retryable_flag(
    status: int, body: str, kind: str, retryable: bool, code: str | None
) -> None:
    error = classify_http(status, {}, body, NOW)
    assert error.type == kind
    assert error.retryable is retryable
    assert error.http_status == status
    assert error.provider_code == code
    if code in SPEND_CODES:  # a spent credit holds the whole account until released (§6.12)
        assert (error.scope, error.retry_after_ms) == ("provider", math.inf)
    else:
        assert error.retry_after_ms is None
    assert error.message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            openai_body("Incorrect API key provided", "invalid_request_error", "invalid_api_key"),
            "Incorrect API key provided",
        ),
        (json.dumps({"error": "plain string error"}), "plain string error"),
        ("not json at all", "not json at all"),
        ("", "HTTP 503"),
    ],
)
def test_the_message_comes_from_the_error_body_or_the_raw_text(body: str, message: str) -> None:
    assert classify_http(503, {}, body, NOW).message == message


# (headers, body, stated wait in ms; None: none stated)
WAIT_CASES = [
    pytest.param({}, None, None, id="nothing-stated"),
    pytest.param({"retry-after-ms": "1500"}, None, 1_500.0, id="retry-after-ms"),
    pytest.param({"Retry-After-Ms": "2500.5"}, None, 2_500.5, id="retry-after-ms-any-case"),
    pytest.param({"retry-after": "30"}, None, 30_000.0, id="retry-after-seconds"),
    pytest.param({"Retry-After": "1.5"}, None, 1_500.0, id="retry-after-fractional-seconds"),
    pytest.param({"retry-after": "0"}, None, 0.0, id="retry-after-zero"),
    pytest.param({"retry-after": http_date(120)}, None, 120_000.0, id="retry-after-future-date"),
    pytest.param({"retry-after": http_date(-120)}, None, 0.0, id="retry-after-past-date"),
    pytest.param({"retry-after": http_date(0)}, None, 0.0, id="retry-after-date-now"),
    pytest.param({}, {"error": {"retry_after_ms": 2_000}}, 2_000.0, id="body-retry_after_ms"),
    pytest.param({}, {"error": {"retry_after": 3}}, 3_000.0, id="body-retry_after"),
    pytest.param({}, {"error": {"retry_after": "4"}}, 4_000.0, id="body-retry_after-string"),
    pytest.param({}, {"error": {"retryDelay": "2s"}}, 2_000.0, id="body-retryDelay"),
    pytest.param(
        {},
        {
            "error": {
                "code": 429,
                "details": [
                    {"@type": "type.googleapis.com/google.rpc.ErrorInfo"},
                    {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1.5s"},
                ],
            }
        },
        1_500.0,
        id="body-error-details-retryDelay",
    ),
    pytest.param({}, {"retry_after_ms": 700}, 700.0, id="top-level-body-retry_after_ms"),
    pytest.param(
        {},
        {"type": "error", "error": {"type": "rate_limit_error", "retry_after": 9}},
        9_000.0,
        id="anthropic-shaped-body",
    ),
    # A negative wait means 0.
    pytest.param({"retry-after-ms": "-5"}, None, 0.0, id="negative-retry-after-ms"),
    pytest.param({"retry-after": "-3"}, None, 0.0, id="negative-retry-after"),
    pytest.param({}, {"error": {"retry_after_ms": -1}}, 0.0, id="negative-body-ms"),
    pytest.param({}, {"error": {"retry_after": -0.5}}, 0.0, id="negative-body-seconds"),
    pytest.param({}, {"error": {"retryDelay": "-2s"}}, 0.0, id="negative-retryDelay"),
]


@pytest.mark.parametrize(("headers", "body", "wait"), WAIT_CASES)
def test_the_stated_wait_is_read_from_headers_or_body(
    headers: dict[str, str], body: Any, wait: float | None
) -> None:
    assert stated_wait_ms(headers, body, NOW) == wait


# A value that is not a finite number: NaN or ±inf, meaning "until released" (architecture.md §6.2).
NON_FINITE_CASES = [
    pytest.param({"retry-after-ms": "nan"}, None, "nan", id="retry-after-ms-nan"),
    pytest.param({"retry-after-ms": "inf"}, None, "inf", id="retry-after-ms-inf"),
    pytest.param({"retry-after-ms": "-inf"}, None, "-inf", id="retry-after-ms-minus-inf"),
    pytest.param({"retry-after-ms": "soon"}, None, "nan", id="retry-after-ms-garbage"),
    pytest.param({"retry-after": "nan"}, None, "nan", id="retry-after-nan"),
    pytest.param({"retry-after": "inf"}, None, "inf", id="retry-after-inf"),
    pytest.param({"retry-after": "whenever"}, None, "nan", id="retry-after-garbage"),
    pytest.param({}, {"error": {"retry_after_ms": "nan"}}, "nan", id="body-ms-nan-string"),
    pytest.param({}, {"error": {"retry_after_ms": float("nan")}}, "nan", id="body-ms-nan-number"),
    pytest.param({}, {"error": {"retry_after": "inf"}}, "inf", id="body-seconds-inf"),
    pytest.param({}, {"error": {"retry_after": "later"}}, "nan", id="body-seconds-garbage"),
    pytest.param({}, {"error": {"retry_after": True}}, "nan", id="body-seconds-boolean"),
    pytest.param({}, {"error": {"retryDelay": "nans"}}, "nan", id="retryDelay-nan"),
    pytest.param(
        {}, {"error": {"details": [{"retryDelay": "forever"}]}}, "nan", id="details-garbage"
    ),
]


@pytest.mark.parametrize(("headers", "body", "kind"), NON_FINITE_CASES)
def test_a_stated_wait_that_is_not_a_finite_number_means_until_released(
    headers: dict[str, str], body: Any, kind: str
) -> None:
    wait = stated_wait_ms(headers, body, NOW)
    assert wait is not None
    assert not math.isfinite(wait)
    if kind == "nan":
        assert math.isnan(wait)
    else:
        assert wait == float(kind)
    error = classify_http(429, headers, json.dumps(body) if body is not None else "", NOW)
    assert error.retry_after_ms is not None and not math.isfinite(error.retry_after_ms)
    stored = error.as_dict()
    assert stored["retry_after_ms"] is None
    assert stored["until_released"] is True


# Precedence: retry-after-ms, retry-after, then the body's retry_after_ms, retry_after,
# retryDelay (error object before the top level).
FULL_BODY = {
    "error": {"retry_after_ms": 3_000, "retry_after": 4, "retryDelay": "5s"},
    "retry_after_ms": 6_000,
}
PRECEDENCE_CASES = [
    pytest.param(
        {"retry-after-ms": "1000", "retry-after": "2"},
        FULL_BODY,
        1_000.0,
        id="retry-after-ms-first",
    ),
    pytest.param(
        {"retry-after-ms": "-1000", "retry-after": "2"},
        FULL_BODY,
        0.0,
        id="a-negative-retry-after-ms-still-wins",
    ),
    pytest.param(
        {"retry-after-ms": "nan", "retry-after": "2"},
        FULL_BODY,
        math.nan,
        id="a-non-finite-retry-after-ms-still-wins",
    ),
    pytest.param({"retry-after": "2"}, FULL_BODY, 2_000.0, id="then-retry-after"),
    pytest.param({"retry-after": http_date(60)}, FULL_BODY, 60_000.0, id="then-retry-after-date"),
    pytest.param({}, FULL_BODY, 3_000.0, id="then-body-retry_after_ms"),
    pytest.param(
        {},
        {"error": {"retry_after": 4, "retryDelay": "5s"}, "retry_after_ms": 6_000},
        4_000.0,
        id="then-body-retry_after",
    ),
    pytest.param(
        {},
        {"error": {"retryDelay": "5s"}, "retry_after_ms": 6_000},
        5_000.0,
        id="then-body-retryDelay",
    ),
    pytest.param(
        {},
        {"error": {"message": "x"}, "retry_after_ms": 6_000},
        6_000.0,
        id="then-the-top-level-body",
    ),
    pytest.param({"x-unrelated": "1"}, {"error": {"message": "x"}}, None, id="none"),
]


@pytest.mark.parametrize(("headers", "body", "wait"), PRECEDENCE_CASES)
def test_the_stated_wait_sources_are_read_in_order(
    headers: dict[str, str], body: Any, wait: float | None
) -> None:
    got = stated_wait_ms(headers, body, NOW)
    if wait is not None and math.isnan(wait):
        assert got is not None and math.isnan(got)
    else:
        assert got == wait
    via_http = classify_http(429, headers, json.dumps(body), NOW).retry_after_ms
    if wait is not None and math.isnan(wait):
        assert via_http is not None and math.isnan(via_http)
    else:
        assert via_http == wait


def test_classify_http_carries_the_stated_wait() -> None:
    error = classify_http(
        429, {"retry-after": "30"}, openai_body("slow down", "requests", "rate_limit_exceeded"), NOW
    )
    assert (error.type, error.retry_after_ms) == ("rate_limit", 30_000.0)
    assert error.as_dict() == {
        "type": "rate_limit",
        "http_status": 429,
        "provider_code": "rate_limit_exceeded",
        "message": "slow down",
        "retryable": True,
        "retry_after_ms": 30_000.0,
        "until_released": False,
    }


# Stream error frames: (payload, type, retryable, http_status, provider_code, retry_after_ms)
FRAME_CASES = [
    pytest.param(
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        "overloaded",
        True,
        529,
        "overloaded_error",
        None,
        id="anthropic-overloaded",
    ),
    pytest.param(
        {"type": "error", "error": {"type": "api_error", "message": "Internal"}},
        "server",
        True,
        500,
        "api_error",
        None,
        id="anthropic-api-error",
    ),
    pytest.param(
        {
            "type": "error",
            "error": {"type": "rate_limit_error", "message": "slow", "retry_after_ms": 2_000},
        },
        "rate_limit",
        True,
        429,
        "rate_limit_error",
        2_000.0,
        id="anthropic-rate-limit-with-wait",
    ),
    pytest.param(
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 201873 tokens > 200000 maximum",
            },
        },
        "context_length",
        False,
        400,
        "invalid_request_error",
        None,
        id="anthropic-prompt-too-long",
    ),
    pytest.param(
        {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}},
        "auth",
        False,
        401,
        "authentication_error",
        None,
        id="anthropic-auth",
    ),
    pytest.param(
        {"type": "error", "error": {"type": "billing_error", "message": "no credit"}},
        "auth",
        False,
        402,
        "billing_error",
        None,
        id="anthropic-billing",
    ),
    pytest.param(
        {"type": "error", "error": {"type": "request_too_large", "message": "too big"}},
        "context_length",
        False,
        413,
        "request_too_large",
        None,
        id="anthropic-too-large",
    ),
    pytest.param(
        {
            "error": {
                "message": "The server had an error",
                "type": "server_error",
                "param": None,
                "code": None,
            }
        },
        "server",
        True,
        500,
        "server_error",
        None,
        id="openai-server-error",
    ),
    pytest.param(
        {
            "error": {
                "message": "Overloaded",
                "type": "overloaded_error",
                "param": None,
                "code": "overloaded",
            }
        },
        "overloaded",
        True,
        529,
        "overloaded",
        None,
        id="openai-overloaded",
    ),
    pytest.param(
        {
            "error": {
                "message": "This model's maximum context length is 128000 tokens.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        "context_length",
        False,
        400,
        "context_length_exceeded",
        None,
        id="openai-context-length",
    ),
    pytest.param(
        {"error": {"message": "Bad gateway", "code": 502}},
        "server",
        True,
        502,
        None,
        None,
        id="numeric-code-as-status",
    ),
    pytest.param(
        {"error": {"message": "Unavailable", "status": 503, "retry_after": 2}},
        "server",
        True,
        503,
        None,
        2_000.0,
        id="status-field-with-wait",
    ),
    pytest.param(
        {
            "error": {
                "code": 429,
                "message": "Resource exhausted",
                "status": "RESOURCE_EXHAUSTED",
                "details": [{"retryDelay": "7s"}],
            }
        },
        "rate_limit",
        True,
        429,
        None,
        7_000.0,
        id="google-style-details",
    ),
    pytest.param(
        {"error": "something broke"}, "unknown", False, None, None, None, id="string-error"
    ),
]


@pytest.mark.parametrize(("payload", "kind", "retryable", "status", "code", "wait"), FRAME_CASES)
def test_a_stream_error_frame_classifies_the_same_way(
    payload: dict[str, Any],
    kind: str,
    retryable: bool,
    status: int | None,
    code: str | None,
    wait: float | None,
) -> None:
    error = classify_frame(payload, NOW)
    assert error.type == kind
    assert error.retryable is retryable
    assert error.http_status == status
    assert error.provider_code == code
    assert error.retry_after_ms == wait


def _frame_bug(reason: str) -> tuple[()]:
    """Was a strict xfail for a bug, fixed since; kept so each case says what it guards."""
    return ()


# The same failure over HTTP and as a stream frame (the stand-in's `form=frame` bodies) must
# classify the same way (architecture.md §5.6).
SAME_WAY_CASES = [
    pytest.param(
        529,
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
        id="anthropic-529",
    ),
    pytest.param(
        500,
        {"error": {"message": "boom", "type": "server_error", "param": None, "code": None}},
        id="openai-500",
    ),
    pytest.param(
        429,
        {
            "error": {
                "message": "Rate limit reached",
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
                "retry_after_ms": 2_000,
            }
        },
        id="openai-429-rate-limit",
        marks=_frame_bug(
            "an openai rate-limit frame (code rate_limit_exceeded, no status) "
            "classifies as unknown (terminal), not rate_limit"
        ),
    ),
    pytest.param(
        429,
        {
            "error": {
                "message": "You exceeded your current quota",
                "type": "insufficient_quota",
                "param": None,
                "code": "insufficient_quota",
            }
        },
        id="openai-429-quota",
        marks=_frame_bug("an openai insufficient_quota frame classifies as unknown, not quota"),
    ),
    pytest.param(
        401,
        {
            "error": {
                "message": "Incorrect API key",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        },
        id="openai-401-auth",
        marks=_frame_bug("an openai invalid_api_key frame classifies as invalid_request, not auth"),
    ),
    pytest.param(
        504,
        {"type": "error", "error": {"type": "timeout_error", "message": "Request timed out"}},
        id="anthropic-504-timeout_error",
        marks=_frame_bug(
            "an anthropic timeout_error frame (HTTP 504 over HTTP: server, retryable) "
            "classifies as unknown (terminal)"
        ),
    ),
]


@pytest.mark.parametrize(("status", "payload"), SAME_WAY_CASES)
def test_a_stream_error_frame_classifies_like_the_same_failure_over_http(
    status: int, payload: dict[str, Any]
) -> None:
    over_http = classify_http(status, {}, json.dumps(payload), NOW)
    as_frame = classify_frame(payload, NOW)
    assert (as_frame.type, as_frame.retryable, as_frame.retry_after_ms) == (
        over_http.type,
        over_http.retryable,
        over_http.retry_after_ms,
    )


def _certificate_refused(verify_message: str | None) -> aiohttp.ClientConnectorCertificateError:
    """The error aiohttp raises when TLS refuses the provider's certificate. OpenSSL's own
    error carries ``verify_message``; one raised by other code may not."""
    refused = ssl.SSLCertVerificationError(
        1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed (_ssl.c:1000)"
    )
    if verify_message is not None:
        refused.verify_message = verify_message
    key = ConnectionKey("api.example.test", 443, True, True, None, None, None)
    return aiohttp.ClientConnectorCertificateError(key, refused)


CONNECTION_FAILURES = [
    # (the exception, what its message says)
    (
        aiohttp.ClientConnectorError(
            ConnectionKey("api.example.test", 443, True, True, None, None, None),
            ConnectionRefusedError(111, "Connect call failed ('203.0.113.7', 443)"),
        ),
        "no connection to the provider: Connect call failed ('an address', 443)",
    ),
    (
        aiohttp.ServerDisconnectedError(),
        "the provider closed the connection before its answer's end",
    ),
    (
        aiohttp.ClientPayloadError("Response payload is not completed"),
        "the provider's answer was cut short"
        " (its body ended before its stated length or last chunk)",
    ),
    (
        aiohttp.ConnectionTimeoutError("Connection timeout to host http://api.example.test"),
        "no connection to the provider within the connect timeout"
        " (AGENTOPS_PROVIDER_CONNECT_TIMEOUT_MS)",
    ),
    (
        ConnectionResetError(104, "Connection reset by peer"),
        "the connection failed: Connection reset by peer",
    ),
    # An error with neither an errno's words nor a message of its own says so, not its class.
    (OSError(), "the connection failed: no reason was given"),
    (
        aiohttp.ClientProxyConnectionError(
            ConnectionKey("api.example.test", 443, True, True, None, None, None),
            ConnectionRefusedError(111, "Connection refused"),
        ),
        "no connection to the proxy: Connection refused",
    ),
    (
        aiohttp.ClientHttpProxyError(
            None,  # type: ignore[arg-type]
            (),
            status=407,
            message="Proxy Authentication Required",
        ),
        "the proxy refused to carry the request (HTTP 407)",
    ),
    (
        _certificate_refused("self-signed certificate"),
        "the provider's TLS certificate was refused: self-signed certificate",
    ),
    (
        _certificate_refused(None),
        "the provider's TLS certificate was refused: [SSL: CERTIFICATE_VERIFY_FAILED]"
        " certificate verify failed (_ssl.c:1000)",
    ),
    (
        RuntimeError("the request to api.example.test at 203.0.113.7 was dropped"),
        "the request failed: the request to the provider's host at an address was dropped",
    ),
]


@pytest.mark.parametrize(
    ("exc", "says"), CONNECTION_FAILURES, ids=[type(e).__name__ for e, _ in CONNECTION_FAILURES]
)
def test_a_connection_error_is_a_retryable_network_failure_that_names_neither_host_nor_address(
    exc: BaseException, says: str
) -> None:
    error = classify_exception(exc, host="api.example.test")
    assert (error.type, error.retryable, error.http_status) == ("network", True, None)
    assert error.message.startswith(says), error.message
    # No class name reaches a caller (ClientOSError, ClientPayloadError...): words only.
    assert type(exc).__name__ not in error.message
    assert "api.example.test" not in error.message and "203.0.113.7" not in error.message


def test_an_answer_whose_head_breaks_a_limit_is_a_server_error_naming_the_limits() -> None:
    exc = aiohttp.ClientResponseError(
        None,  # type: ignore[arg-type]
        (),
        status=400,
        message="Too many headers received",
    )
    error = classify_exception(exc)
    assert (error.type, error.provider_code, error.retryable) == ("server", "bad_response", True)
    assert error.message == (
        "the provider's answer was refused: Too many headers received (header limits: "
        "AGENTOPS_PROVIDER_MAX_HEADERS, AGENTOPS_PROVIDER_MAX_HEADER_BYTES)"
    )


def _is_bounded_head_and_tail(bounded: str, original: str, limit: int) -> bool:
    head, _, rest = bounded.partition(" …[")
    _, _, tail = rest.partition("]… ")
    return len(bounded) <= limit and original.startswith(head) and original.endswith(tail)


def test_a_one_megabyte_message_is_bounded_to_2000_characters() -> None:
    huge = "The request failed: " + "x" * 1_000_000 + " END"
    cases = [
        ("", classify_http(500, {}, json.dumps({"error": {"message": huge}}), NOW)),
        ("", classify_http(500, {}, huge, NOW)),
        (
            "",
            classify_frame({"type": "error", "error": {"type": "api_error", "message": huge}}, NOW),
        ),
        ("the connection failed: ", classify_exception(OSError(huge))),
    ]
    for prefix, error in cases:
        original = prefix + huge
        assert len(error.message) == 2000
        assert f" of {len(original)} characters omitted]… " in error.message
        assert _is_bounded_head_and_tail(error.message, original, 2000)
        assert error.message.startswith(prefix + "The request failed: ")
        assert error.message.endswith("x END")


def test_a_frame_without_a_message_is_shown_bounded() -> None:
    payload = {"error": {"type": "api_error", "detail": "y" * 1_000_000}}
    error = classify_frame(payload, NOW)
    assert len(error.message) <= 2000
    assert (
        error.message == json.dumps(payload)[:2000]
    )  # the frame itself, its first 2000 characters


def test_a_small_frame_without_a_message_is_shown_whole() -> None:
    payload = {"error": {"type": "api_error", "detail": "upstream reset"}}
    assert classify_frame(payload, NOW).message == json.dumps(payload)


@pytest.mark.parametrize("length", [128, 129, 1_000, 100_000])
def test_a_provider_code_is_bounded_to_128_characters(length: int) -> None:
    code = "c" * length
    for error in (
        classify_http(400, {}, json.dumps({"error": {"message": "bad", "code": code}}), NOW),
        classify_frame({"error": {"message": "bad", "code": code}}, NOW),
    ):
        assert error.provider_code is not None
        assert len(error.provider_code) == min(length, 128)
        if length <= 128:
            assert error.provider_code == code
        else:
            assert _is_bounded_head_and_tail(error.provider_code, code, 128)


# --- waits and rate limits as gateways and vendors state them (issue: real gateways) ----------

GATEWAY_WAITS = [
    pytest.param({"llm_provider-retry-after": "7200"}, 7_200_000.0, id="litellm-seconds"),
    pytest.param({"llm_provider-retry-after-ms": "1500"}, 1_500.0, id="litellm-ms"),
    pytest.param({"x-ms-retry-after-ms": "2500"}, 2_500.0, id="azure-ms"),
    pytest.param({"LLM_Provider-Retry-After": "3"}, 3_000.0, id="any-case"),
    pytest.param(
        {"retry-after": "60", "llm_provider-retry-after": "7200"},
        7_200_000.0,
        id="the-gateway-form-is-longer",
    ),
    pytest.param(
        {"retry-after-ms": "90000", "llm_provider-retry-after": "7"},
        90_000.0,
        id="the-standard-form-is-longer",
    ),
    pytest.param(
        {"retry-after": "2", "x-ms-retry-after-ms": "nan"},
        math.inf,
        id="a-non-finite-gateway-wait-outlasts",
    ),
    pytest.param(
        {"retry-after": "60", "x-ms-retry-after-ms": "1000"},
        60_000.0,
        id="the-standard-form-is-longer-than-azures",
    ),
    pytest.param({"llm_provider-retry-after": "-5"}, 0.0, id="negative-is-0"),
    pytest.param({"llm_provider-retry-after": http_date(30)}, 30_000.0, id="litellm-http-date"),
]


@pytest.mark.parametrize(("headers", "wait"), GATEWAY_WAITS)
def test_a_wait_a_gateway_or_vendor_states_in_its_own_header_is_read_and_the_longest_wins(
    headers: dict[str, str], wait: float
) -> None:
    got = classify_http(
        429, headers, json.dumps({"error": {"message": "slow down", "retry_after_ms": 1}}), NOW
    ).retry_after_ms
    assert got is not None
    if math.isinf(wait):
        assert not math.isfinite(got)
    else:
        assert got == wait


REWRITTEN = {
    "error": {
        "message": "litellm.RateLimitError: rate limited by the provider",
        "type": "throttling_error",
        "param": None,
        "code": "429",
    }
}


@pytest.mark.parametrize("status", [429, 500, 400])
def test_a_gateways_rewritten_rate_limit_body_is_a_rate_limit_whatever_status_carries_it(
    status: int,
) -> None:
    error = classify_http(status, {}, json.dumps(REWRITTEN), NOW)
    assert (error.type, error.retryable, error.http_status) == ("rate_limit", True, status)


@pytest.mark.parametrize(
    "frame",
    [
        REWRITTEN,
        {"error": {"message": "x", "code": 429}},
        {"error": {"message": "x", "type": "rate_limit_exceeded"}},
        {"type": "error", "error": {"type": "throttling_error", "message": "x"}},
    ],
    ids=["litellm-rewrite", "numeric-code", "rate_limit_exceeded-type", "anthropic-shaped"],
)
def test_a_gateways_rewritten_rate_limit_frame_is_a_rate_limit(frame: dict[str, Any]) -> None:
    error = classify_frame(frame, NOW)
    assert (error.type, error.retryable) == ("rate_limit", True)


@pytest.mark.parametrize("status", [500, 400])
@pytest.mark.parametrize(
    "error",
    [
        {"message": "slow down", "code": "429"},
        {"message": "slow down", "code": 429},
        {"message": "slow down", "code": "rate_limit_exceeded"},
    ],
    ids=["code-429-as-text", "code-429-as-a-number", "code-rate_limit_exceeded"],
)
def test_a_body_whose_code_alone_says_rate_limited_is_a_rate_limit_whatever_status_carries_it(
    error: dict[str, Any], status: int
) -> None:
    got = classify_http(status, {}, json.dumps({"error": error}), NOW)
    assert (got.type, got.retryable, got.http_status) == ("rate_limit", True, status)


# --- the service's own refusals (architecture.md §6.13, §6.14, §15) ---------------------------


def test_a_call_paced_by_its_providers_quota_is_a_retryable_refusal_saying_when_it_comes_back() -> (
    None
):
    error = paced_error(provider="openai", model="gpt-4o", wait_ms=1234.2)
    assert (error.type, error.provider_code, error.retryable, error.retry_after_ms) == (
        "paced",
        "paced",
        True,
        1234.2,
    )
    assert (error.http_status, error.scope, error.limit) == (None, "agent", None)
    assert error.message == (
        "provider openai's quota for gpt-4o has no room now (its remaining-quota headers said "
        "so); no call was made; it comes back in 1235 ms"
    )


def test_a_call_refused_by_a_project_limit_is_a_retryable_refusal_naming_the_limit() -> None:
    said = "the project's requests per minute (60) are spent; it has room again in 500 ms"
    error = project_limit_error(limit="requests_per_minute", message=said, wait_ms=500.0)
    assert error == ProviderError(
        type="paced",
        message=said,
        provider_code="project_limit",
        retryable=True,
        retry_after_ms=500.0,
        scope="project",
        limit="requests_per_minute",
    )


def test_an_answer_that_breaks_http_is_a_retryable_server_error_with_its_code() -> None:
    error = protocol_error("bad_chunk", "the chunk's size line was not hex")
    assert error == ProviderError(
        type="server",
        message="the chunk's size line was not hex",
        provider_code="bad_chunk",
        retryable=True,
    )
    assert protocol_error("bad_chunk", "x" * 5000).message == bound_text("x" * 5000)
