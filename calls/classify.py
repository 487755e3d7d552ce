"""Classifying provider failures into one shape (architecture.md §5.6), with the stated wait.

Pure: headers, bodies and ``now`` come in; a ProviderError goes out.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import aiohttp

from agentops.retrying import clamp_wait, retry_after_header_ms, wait_number
from agentops.text import PROVIDER_CODE_LIMIT, bound_text, untrusted_json, untrusted_text
from calls.limits import Quota, limit_scope, next_month_ms, quota_from_headers
from calls.types import ProviderError

RETRYABLE_TYPES = {"rate_limit", "server", "overloaded", "network", "timeout"}

# The overflow table (architecture.md §5.6, "Context-length refusals"): what each provider says
# when a request is over its window. Any of these at 400/404/422 (or a frame) is context_length.
_CONTEXT_RE = re.compile(
    r"context[_ ]length|maximum context|context window|prompt is too long|too many tokens"
    r"|input is too long|reduce the length|exceed context limit|available context size"
    r"|ContextWindowExceeded|tokens exceed the configured limit|maximum model length",
    re.IGNORECASE,
)
# Codes and types that name an overflow whatever status carries them (llama.cpp's server once
# answered its context-size error with a 500).
CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
# The window a refusal states, first match wins; each pattern's one group is the limit.
_CONTEXT_LIMIT_RES = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        r"maximum context length is ([\d,]+)",  # OpenAI, Azure, vLLM, LiteLLM's rewrite of them
        r"prompt is too long: [\d,]+ tokens > ([\d,]+) maximum",  # Anthropic
        r"exceed context limit: [\d,]+ \+ [\d,]+ > ([\d,]+)",  # Anthropic, input + max_tokens
        r"configured limit of ([\d,]+) tokens",  # Azure / OpenAI "Input tokens exceed ..."
        r"maximum model length of ([\d,]+)",  # vLLM's decoder-prompt form
    )
)
_QUOTA_RE = re.compile(r"quota|billing|credit", re.IGNORECASE)
_POLICY_RE = re.compile(r"content[_ ]policy|content[_ ]filter|safety", re.IGNORECASE)

# Anthropic's error types, as the status they stand for (used for stream error frames).
_ANTHROPIC_TYPE_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "overloaded_error": 529,
    "timeout_error": 504,
}
# OpenAI-compatible codes and types, as the status the same failure has over HTTP (frames
# carry no status). Codes are looked up before types.
_OPENAI_CODE_STATUS = {
    "rate_limit_exceeded": 429,
    "insufficient_quota": 429,
    "invalid_api_key": 401,
    "context_length_exceeded": 400,
    "requests": 429,
    "tokens": 429,
    "invalid_request_error": 400,
    "server_error": 500,
}


def _error_object(body: Any) -> dict[str, Any]:
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return err
        if isinstance(err, str):
            return {"message": err}
        return body
    return {}


def _parse_body(text: str) -> Any:
    try:
        return untrusted_json(text)
    except ValueError:
        return None


# Headers gateways and vendors state a wait in, beside retry-after-ms and retry-after: LiteLLM's
# proxy passes a provider's on as llm_provider-<header>, Azure OpenAI states x-ms-retry-after-ms.
MS_HEADERS = ("llm_provider-retry-after-ms", "x-ms-retry-after-ms")
SECONDS_HEADERS = ("llm_provider-retry-after",)


def stated_wait_ms(headers: Mapping[str, str], body: Any, now_ms: float) -> float | None:
    """The provider's stated wait in ms, or None if it stated none.

    Headers first: ``retry-after-ms``, else ``retry-after`` (seconds or an HTTP date), and each
    gateway or vendor form (``MS_HEADERS``, ``SECONDS_HEADERS``); when several state a wait
    the longest wins. Without any, the body's ``retry_after_ms``, ``retry_after``,
    ``retryDelay``. Negative or past means 0; a value that is not a finite number comes back
    as NaN or ±inf ("until released", architecture.md §6.2) and outlasts any other.
    """
    lower = {k.lower(): v for k, v in headers.items()}
    stated: list[float] = []
    standard = wait_number(lower["retry-after-ms"]) if "retry-after-ms" in lower else None
    if standard is not None:
        stated.append(clamp_wait(standard))
    elif "retry-after" in lower:
        stated.append(retry_after_header_ms(lower["retry-after"], now_ms))
    stated += [
        clamp_wait(v) for name in MS_HEADERS if (v := wait_number(lower.get(name))) is not None
    ]
    stated += [
        retry_after_header_ms(lower[name], now_ms) for name in SECONDS_HEADERS if name in lower
    ]
    if stated:
        return longest(stated)
    err = _error_object(body)
    for source in (err, body if isinstance(body, dict) else {}):
        if "retry_after_ms" in source:
            value = wait_number(source["retry_after_ms"])
            if value is not None:
                return clamp_wait(value)
        if "retry_after" in source:
            value = wait_number(source["retry_after"])
            if value is not None:
                return clamp_wait(value * 1000)
        delay = _retry_delay(source)
        if delay is not None:
            return clamp_wait(delay * 1000)
    return None


def longest(waits: list[float]) -> float:
    """The longest of several stated waits; one that is not a finite number outlasts any."""
    return next((w for w in waits if not math.isfinite(w)), max(waits))


def _retry_delay(source: Mapping[str, Any]) -> float | None:
    if "retryDelay" in source:
        return wait_number(source["retryDelay"])
    details = source.get("details")
    if isinstance(details, list):
        for item in details:
            if isinstance(item, dict) and "retryDelay" in item:
                return wait_number(item["retryDelay"])
    return None


def stated_context_limit(message: str, err: Mapping[str, Any] | None = None) -> int | None:
    """The window in tokens an overflow refusal states: from its message (the patterns of
    ``_CONTEXT_LIMIT_RES``) or llama.cpp's ``n_ctx`` beside it; None when it states none."""
    for pattern in _CONTEXT_LIMIT_RES:
        found = pattern.search(message)
        if found:
            value = int(found.group(1).replace(",", ""))
            return value if value > 0 else None
    n_ctx = (err or {}).get("n_ctx")
    if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0:
        return n_ctx
    return None


def _with_limit(error: ProviderError, err: Mapping[str, Any]) -> ProviderError:
    if error.type != "context_length":
        return error
    limit = stated_context_limit(error.message, err)
    return replace(error, context_limit=limit) if limit is not None else error


def _overflow_code(err: Mapping[str, Any]) -> bool:
    return any(
        isinstance(v, str) and v in CONTEXT_CODES for v in (err.get("code"), err.get("type"))
    )


def classify_http(
    status: int, headers: Mapping[str, str], body_text: str, now_ms: float
) -> ProviderError:
    body = _parse_body(body_text)
    err = _error_object(body)
    message = str(err.get("message") or untrusted_text(body_text) or f"HTTP {status}")
    code = err.get("code") or err.get("type")
    if _overflow_code(err):
        code = err.get("type") if err.get("type") in CONTEXT_CODES else err.get("code")
    wait = stated_wait_ms(headers, body, now_ms)
    # A gateway may answer a provider's rate limit with a status of its own and say it in the body.
    like = 429 if _throttled(err) else 400 if _overflow_code(err) else None
    error = _classify(status, code, message, wait, like=like)
    return _scoped(_with_limit(error, err), err, quota_from_headers(headers, now_ms), now_ms)


def _scoped(
    error: ProviderError, err: Mapping[str, Any], quota: Quota | None, now_ms: float
) -> ProviderError:
    """Whom the refusal binds (architecture.md §6.12). A spent credit or spend cap holds the
    account until released (a monthly cap until the next month begins) unless it states a
    wait; an acceleration limit that may not be retried keeps its terminal disposition."""
    if error.type not in ("rate_limit", "quota", "invalid_request"):
        return error
    details = err.get("details")
    detail_code = details.get("error_code") if isinstance(details, dict) else None
    scoped = limit_scope(
        throttled=error.type in ("rate_limit", "quota"),
        codes=(err.get("code"), err.get("type"), detail_code, error.provider_code),
        message=error.message,
        quota=quota,
    )
    if scoped.scope == "agent" or (scoped.acceleration and not error.retryable):
        return error
    wait = error.retry_after_ms
    if scoped.spend and wait is None:
        wait = next_month_ms(now_ms) - now_ms if scoped.monthly else math.inf
    elif wait is None and quota is not None:
        # No stated wait, but its headers say when what is spent comes back.
        reset = quota.requests_reset_ms if quota.requests_remaining == 0 else quota.tokens_reset_ms
        wait = max(0.0, reset - now_ms) if reset is not None else None
    return replace(
        error,
        scope=scoped.scope,
        acceleration=scoped.acceleration,
        retry_after_ms=wait,
        # A spent credit is no failure of the request: the account waits, its turns held.
        type="quota" if scoped.spend else error.type,
    )


# A body or frame that says "rate limited" whatever status carries it: a ``code`` of 429 (a
# gateway's rewrite, as text or a number), or one of these types.
THROTTLED_TYPES = frozenset({"throttling_error", "rate_limit_exceeded", "rate_limit_error"})


def _throttled(err: Mapping[str, Any]) -> bool:
    code, etype = err.get("code"), err.get("type")
    return (
        code in (429, "429")
        or (isinstance(etype, str) and etype in THROTTLED_TYPES)
        or code in THROTTLED_TYPES
    )


def classify_frame(payload: Any, now_ms: float) -> ProviderError:
    """A stream error frame (anthropic ``event: error`` or an openai ``{"error": ...}`` chunk).

    A frame arrives inside an HTTP 200 stream and carries no status of its own; it is
    classified, and reported with the status, that the same failure has over HTTP."""
    err = _error_object(payload)
    etype = err.get("type")
    code = err.get("code")
    stated = err.get("status") if isinstance(err.get("status"), int) else None
    if stated is None and isinstance(code, int):
        stated = code
    like = 429 if stated is None and _throttled(err) else stated
    for key, table in (
        (code, _OPENAI_CODE_STATUS),
        (etype, _ANTHROPIC_TYPE_STATUS),
        (etype, _OPENAI_CODE_STATUS),
    ):
        if like is None and isinstance(key, str):
            like = table.get(key)
    code_text = code if isinstance(code, str) else etype
    message = str(err.get("message") or json.dumps(payload)[:2000])
    error = _classify(like, code_text, message, stated_wait_ms({}, payload, now_ms))
    return _scoped(_with_limit(error, err), err, None, now_ms)


def _classify(
    status: int | None, code: Any, message: str, wait: float | None, *, like: int | None = None
) -> ProviderError:
    """``status`` is reported; the failure is classified as ``like`` says when given."""
    code_text = str(code) if code is not None else ""
    both = f"{code_text} {message}"
    reported, status = status, like if like is not None else status
    if status == 429:
        kind = "quota" if _QUOTA_RE.search(code_text) else "rate_limit"
    elif status == 408:
        kind = "timeout"
    elif status in (401, 402, 403):
        kind = "auth"
    elif status == 413 or (status in (400, 404, 422, None) and _CONTEXT_RE.search(both)):
        kind = "context_length"
    elif status in (400, 422, None) and _POLICY_RE.search(code_text):
        kind = "policy"
    elif status in (400, 404, 422):
        kind = "invalid_request"
    elif status == 529 or "overloaded" in code_text:
        kind = "overloaded"
    elif status is not None and 500 <= status < 600:
        kind = "server"
    else:
        kind = "unknown"
    return ProviderError(
        type=kind,
        message=bound_text(message),
        http_status=reported,
        provider_code=bound_text(code_text, PROVIDER_CODE_LIMIT) if code_text else None,
        retryable=kind in RETRYABLE_TYPES,
        retry_after_ms=wait,
    )


def paced_error(*, provider: str, model: str, wait_ms: float) -> ProviderError:
    """A call not sent because its provider's quota has no room for it within the caller's
    wait (architecture.md §6.13): agentops's own 429, which may be retried after ``wait_ms``."""
    return ProviderError(
        type="paced",
        provider_code="paced",
        message=(
            f"provider {provider}'s quota for {model} has no room now (its remaining-quota "
            f"headers said so); no call was made; it comes back in {math.ceil(wait_ms)} ms"
        ),
        retryable=True,
        retry_after_ms=wait_ms,
    )


def project_limit_error(*, limit: str, message: str, wait_ms: float) -> ProviderError:
    """A call not sent because a limit of its project (``limit``) has no room for it within
    the caller's wait (architecture.md §6.14): agentops's own 429, like ``paced_error``'s,
    scoped to the project, which may be retried after ``wait_ms``."""
    return ProviderError(
        type="paced",
        provider_code="project_limit",
        message=message,
        retryable=True,
        retry_after_ms=wait_ms,
        scope="project",
        limit=limit,
    )


def protocol_error(code: str, message: str) -> ProviderError:
    """An answer that breaks HTTP or a limit of ours (architecture.md §15): the provider misbehaved,
    as a server error does, and the call may be made again."""
    return ProviderError(
        type="server", provider_code=code, message=bound_text(message), retryable=True
    )


def classify_exception(exc: BaseException, *, host: str | None = None) -> ProviderError:
    """A failure below HTTP's answer (no answer, or not a whole one): a ``network`` error, which
    may be retried, or a ``server`` error for an answer that does not parse or breaks the header
    limits. The message is the service's own words with the operating system's or TLS's
    reason; the provider's host and addresses are left out (tenants do not see its base_url)."""
    if isinstance(exc, aiohttp.ClientHttpProxyError):
        what = f"the proxy refused to carry the request (HTTP {exc.status})"
    elif isinstance(exc, aiohttp.ClientResponseError):
        # Raised while the answer's head was parsed (the client never raises it for a status).
        return protocol_error(
            "bad_response",
            f"the provider's answer was refused: {exc.message} (header limits: "
            "AGENTOPS_PROVIDER_MAX_HEADERS, AGENTOPS_PROVIDER_MAX_HEADER_BYTES)",
        )
    elif isinstance(exc, aiohttp.ClientConnectorCertificateError):
        reason = getattr(exc.certificate_error, "verify_message", "") or str(exc.certificate_error)
        what = f"the provider's TLS certificate was refused: {reason}"
    elif isinstance(exc, aiohttp.ClientProxyConnectionError):
        what = f"no connection to the proxy: {_os_reason(exc.os_error)}"
    elif isinstance(exc, aiohttp.ClientConnectorError):
        what = f"no connection to the provider: {_os_reason(exc.os_error)}"
    elif isinstance(exc, TimeoutError):
        what = (
            "no connection to the provider within the connect timeout "
            "(AGENTOPS_PROVIDER_CONNECT_TIMEOUT_MS)"
        )
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        what = "the provider closed the connection before its answer's end"
    elif isinstance(exc, aiohttp.ClientPayloadError):
        what = (
            "the provider's answer was cut short "
            "(its body ended before its stated length or last chunk)"
        )
    elif isinstance(exc, OSError):
        what = f"the connection failed: {_os_reason(exc)}"
    else:
        what = f"the request failed: {exc}"
    return ProviderError(
        type="network",
        # In words only: a caller reads what happened, not aiohttp's class names.
        message=bound_text(redacted(what, host)),
        retryable=True,
    )


def _os_reason(error: BaseException) -> str:
    return getattr(error, "strerror", None) or str(error) or "no reason was given"


_ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b|\[?[0-9a-fA-F]*:[0-9a-fA-F:]+:[0-9a-fA-F]*\]?")


def redacted(text: str, host: str | None) -> str:
    """``text`` without the provider's host name and without any address: a tenant may read
    a call's error, and ``GET /providers`` hides the base_url from tenants."""
    if host:
        text = text.replace(host, "the provider's host")
    return _ADDRESS.sub("an address", text)
