"""``POST /v1/chat/completions``, ``POST /v1/messages`` and ``POST /v1/responses``: the drop-in
endpoints (architecture.md §14, API.md "Drop-in endpoints").

An official SDK pointed here with an agentops API token as its key (``Authorization: Bearer``
or ``x-api-key``) and an agent's name as ``model`` gets the agent's provider and model, as an
auxiliary call (``turns.dropin``): admission, the progress bounds, classification,
the provider's stated waits recorded, a call row. A transient failure before the provider's
response started is made again there, each attempt its own row. Streams are relayed event by
event as they arrive, keepalives included; a cut ends the stream with an error event naming the
bound.
Errors come in the endpoint's own format, so the SDK raises its usual exceptions.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    StreamingHttpResponse,
)
from django.views.decorators.csrf import csrf_exempt

from agentops import selectors
from agentops.exceptions import NotFound
from agentops.memory import Recent
from agentops.models import Agent, ApiToken
from agentops.text import bound_text, untrusted_json, untrusted_json_text
from agentops.tokens import api_token_check
from agentops.validation import PASS_ON_DEPTH_LIMIT, json_loads, number_problem, sendable_problem
from calls.client import CallResult
from calls.sse import SseEvent
from interfaces.dropin.formats import (
    ANTHROPIC,
    FORMATS,
    OPENAI,
    Format,
    error,
    sse_bytes,
)
from interfaces.dropin.listing import asked_format, models_response
from interfaces.edge import runtime_of
from turns.auxiliary import Deferred
from turns.dropin import DropinCall, wait_headers
from turns.runtime import Found, TurnRuntime

# A provider's error body up to this size is passed through as it came; a larger one is
# replaced by the format's error with the classified (bounded) message.
PASSTHROUGH_CAP = 64 * 1024
# The provider's response headers a passed-through error keeps.
PASSED_HEADERS = ("retry-after", "retry-after-ms", "x-request-id", "request-id")
STREAM_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
# The fields that bound a reply's length, in any of the three formats, and their range.
MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
MAX_TOKENS_LIMIT = 2**31 - 1
# Where ``serve`` leaves the call it started, for the Idempotency-Key wrapper
# (``interfaces.dropin.idempotent``): absent, no provider call was made.
CALL_META = "agentops.dropin_call"


@csrf_exempt
async def models(request: HttpRequest, model_id: str | None = None) -> HttpResponseBase:
    """``GET /v1/models`` and ``GET /v1/models/{id}`` (``interfaces.dropin.listing``)."""
    if request.method not in ("GET", "HEAD"):
        return error(
            asked_format(request), 405, f"method {request.method} is not allowed here: use GET"
        )
    return await runtime_of(request).db(
        models_response, request, presented_token(request), model_id
    )


@csrf_exempt
async def unknown(request: HttpRequest) -> HttpResponseBase:
    """Any other path under ``/v1/``: a 404 in the shape of the SDK that asked (Anthropic's
    sends ``anthropic-version``), naming the endpoints there are."""
    fmt = ANTHROPIC if "anthropic-version" in request.headers else OPENAI
    there = ", ".join([*(f"POST {f.path}" for f in FORMATS.values()), "GET /v1/models"])
    # OpenAI's code for a 404 is model_not_found, which would mislead here.
    return error(
        fmt,
        404,
        f"no drop-in endpoint at {bound_text(request.path, 200)}: there are {there}",
        code="unknown_url" if fmt is OPENAI else None,
    )


def presented_token(request: HttpRequest) -> str:
    """The API key as either SDK sends it: ``Authorization: Bearer`` or ``x-api-key``."""
    authorization = request.headers.get("Authorization", "")
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("X-Api-Key", "").strip()


@dataclass
class Looked:
    """What one trip to the database found: the token, the agent, the call and its admission."""

    token: ApiToken | None = None
    agent: Agent | None = None
    call: DropinCall | None = None
    deferred: Deferred | None = None


def _cached(cache: Recent[Any, Any], key: Any, find: Any) -> Any:
    hit = cache.get(key)
    if hit is not None:
        return hit
    value = find()
    if value is not None:
        cache.put(key, value)
    return value


def token_found(found: Found, token_text: str) -> ApiToken | None:
    """The valid token ``token_text`` names, from what the runtime found within
    ``FOUND_S``; None for none or one not valid."""
    if not token_text:
        return None
    key = hashlib.sha256(token_text.encode()).hexdigest()
    token: ApiToken | None = _cached(found.tokens, key, lambda: api_token_check(token_text))
    return token


def look_up(
    rt: TurnRuntime,
    token_text: str,
    body: dict[str, Any] | None,
    fmt: Format,
    headers: dict[str, str],
) -> Looked:
    """The token, then (for a well-formed body) the agent ``model`` names and, when it speaks
    this endpoint's format, the admission of its call: all in one thread hop."""
    token = token_found(rt.found, token_text)
    looked = Looked(token=token)
    if token is None or body is None:
        return looked
    try:
        looked.agent = _cached(
            rt.found.agents,
            (token.pk, body["model"]),
            lambda: selectors.agent_for(token=token, name=body["model"]),
        )
    except NotFound:
        return looked
    assert looked.agent is not None
    if looked.agent.provider.kind == fmt.kind:
        looked.call = DropinCall(rt, agent=looked.agent, body=body, headers=headers)
        looked.deferred = looked.call.admit()
    return looked


def parse(request: HttpRequest) -> tuple[dict[str, Any] | None, tuple[int, str, str] | None]:
    """The body as a JSON object, or the problem with it (status, message, field)."""
    try:
        raw = request.body
    except RequestDataTooBig:
        return None, (413, "body: the request body is too large", "body")
    try:
        body = json_loads(raw, depth_limit=PASS_ON_DEPTH_LIMIT, strings=sendable_problem)
    except ValueError as exc:
        return None, (400, f"body: {exc}", "body")
    if not isinstance(body, dict):
        return None, (400, "body: must be a JSON object", "body")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        return None, (400, "model: required, the name of an agent", "model")
    if "stream" in body and not isinstance(body["stream"], bool):
        return None, (400, "stream: must be true or false", "stream")
    # Numbers are checked before any call, so every call made can be recorded (a call row's
    # max_tokens is a 32-bit column) and no provider is sent what it cannot read.
    numbers = number_problem(body)
    if numbers is not None:
        where, why = numbers
        return None, (400, f"{where}: {why}", where)
    for field in MAX_TOKENS_FIELDS:
        value = body.get(field)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not 1 <= value <= MAX_TOKENS_LIMIT
        ):
            return None, (
                400,
                f"{field}: must be a whole number from 1 to {MAX_TOKENS_LIMIT}",
                field,
            )
    return body, None


async def serve(rt: TurnRuntime, request: HttpRequest, fmt: Format) -> HttpResponseBase:
    """A drop-in request (``idempotent`` hands it over, with the process's runtime ``rt``)."""
    if request.method != "POST":
        return error(fmt, 405, f"method {request.method} is not allowed here: use POST {fmt.path}")
    body, problem = parse(request)
    headers = {k.lower(): v for k, v in request.headers.items()}
    looked = await rt.db(look_up, rt, presented_token(request), body, fmt, headers)
    if looked.token is None:
        return error(
            fmt,
            401,
            "a valid agentops API token is required as the API key (Authorization: Bearer <token> or x-api-key: <token>)",
        )
    if problem is not None or body is None:
        status, message, field = problem or (400, "body: missing", "body")
        return error(fmt, status, message, extra={"param": field})
    agent = looked.agent
    if agent is None:
        return error(
            fmt,
            404,
            f"model: no agent named {bound_text(body['model'], 200)!r}",
            extra={"param": "model"},
        )
    call = looked.call
    if call is None:
        right = FORMATS.get(agent.provider.kind)
        where = f"send it to POST {right.path}" if right else "no drop-in endpoint serves it"
        label = right.label if right else agent.provider.kind
        return error(
            fmt,
            400,
            f"model: agent {agent.name!r} speaks the {label} format, not {fmt.label}: {where}",
            extra={"param": "model"},
        )
    deferred = looked.deferred
    if deferred is not None:
        remaining = deferred.retry_after_ms if deferred.retry_after_ms is not None else math.inf
        return error(
            fmt, 429, deferred.message, extra=deferred.data(), headers=wait_headers(remaining)
        )
    request.META[CALL_META] = call
    call.start()
    try:
        streaming, seen = await opening(call)
    except asyncio.CancelledError:
        call.abort()  # the client went away before the answer: the call ends, recorded as aborted
        raise
    if streaming:
        return StreamingHttpResponse(
            relay(call, fmt, seen),
            content_type="text/event-stream; charset=utf-8",
            headers=STREAM_HEADERS,
        )
    wire = next((item for item in reversed(seen) if item[0] in ("body", "error_body")), None)
    return answer(fmt, seen[-1][1], wire)


async def opening(call: DropinCall) -> tuple[bool, list[tuple[str, Any]]]:
    """Whether to answer with a stream, and what the call said so far (through its end, when
    not). A streamed call's answer starts once there is something to send: the provider's
    first event, or a keepalive once the client has waited ``AGENTOPS_DROPIN_KEEPALIVE_MS``.
    From then on a failure can only come as an error event (the status went out with the first
    byte); before it, the call's failure is answered with the status the non-streamed path
    gives (a cut 504, a refused or broken answer 502), as 2xx headers alone send nothing."""
    seen: list[tuple[str, Any]] = []
    started = (
        asyncio.get_running_loop().time() + settings.AGENTOPS_DROPIN_KEEPALIVE_MS / 1000
        if call.streamed
        else None
    )
    try:
        async with asyncio.timeout_at(started):
            while not seen or seen[-1][0] != "end":
                seen += await call.arrived()
                if call.streamed and any(kind == "sse" for kind, _ in seen):
                    return True, seen
    except TimeoutError:
        return True, seen
    return False, seen


def answer(fmt: Format, result: CallResult | None, wire: tuple[str, Any] | None) -> HttpResponse:
    """The whole response of a call that sent no stream: the provider's body as it came, its
    error passed through, or the format's error for a cut or a failure of its own."""
    response = _answered(fmt, result, wire)
    # What the call came to is its row's (and the provider's): Django would log every relayed
    # 5xx as its own "Internal Server Error" and every 4xx as a warning.
    response._has_been_logged = True  # type: ignore[attr-defined]
    return response


def _answered(fmt: Format, result: CallResult | None, wire: tuple[str, Any] | None) -> HttpResponse:
    if result is None:
        return error(
            fmt, 503, "the call could not be made or recorded (the database is unavailable)"
        )
    if result.outcome == "completed" and wire is not None and wire[0] == "body":
        return HttpResponse(
            untrusted_json_text(wire[1].decode("utf-8", "replace")),
            status=200,
            content_type="application/json",
        )
    if wire is not None and wire[0] == "error_body":
        status, headers, data = wire[1]
        kept = {name: headers[name] for name in PASSED_HEADERS if name in headers}
        stated = result.error.retry_after_ms if result.error is not None else None
        if stated is not None:  # as the SDK reads it, whichever form the provider or gateway used
            kept.update(wait_headers(stated))
        relayed = (
            _json_passed(data, headers.get("content-type", ""))
            if len(data) <= PASSTHROUGH_CAP
            else None
        )
        if relayed is not None:
            return HttpResponse(
                relayed, status=status, content_type="application/json", headers=kept
            )
        # Not JSON (a gateway's HTML page), or too large to pass: the format's own error,
        # whose message is the provider's text, bounded.
        message = result.error.message if result.error else f"HTTP {status}"
        return error(fmt, status, message, headers=kept)
    failure = result.error
    message = failure.message if failure else "the call did not complete"
    if failure is not None and failure.type == "budget":
        # Not sent: the budget holds until its period resets (architecture.md §18.3). An
        # SDK must not retry for hours: the answer says so, with the reset.
        reset = failure.resets_at_ms
        until = datetime.fromtimestamp(reset / 1000, UTC) if reset is not None else None
        left = reset - time.time() * 1000 if reset is not None else math.inf
        return error(
            fmt,
            429,
            message,
            extra={"retryable": False, "until": until},
            headers={**wait_headers(left), "x-should-retry": "false"},
        )
    if failure is not None and failure.type == "budget_refused":
        # Not sent, and never will be as it is: its estimate (or max_tokens alone) is over the
        # whole budget, or its model has no price (§18.1). The request must change: a 400
        # naming the field, not a hold for everyone until the reset.
        return error(
            fmt,
            400,
            message,
            extra={"param": failure.provider_code, "retryable": False},
            headers={"x-should-retry": "false"},
        )
    if failure is not None and failure.type == "budget_busy":
        # Not sent: it fits once the budget's calls in flight settle (§18.1); the SDK's own
        # retry, after this wait, may be sent.
        wait = settings.AGENTOPS_BUDGET_BUSY_RETRY_MS
        return error(fmt, 429, message, extra={"retryable": True}, headers=wait_headers(wait))
    if failure is not None and failure.type == "paced":
        # Not sent: the provider's quota, or a limit of the agent's project (§6.14), has no
        # room within AGENTOPS_DROPIN_MAX_WAIT_MS (§6.13). agentops's own 429: the SDK may
        # retry once it comes back.
        wait = failure.retry_after_ms if failure.retry_after_ms is not None else 1000.0
        named = {"x-agentops-limit": f"project {failure.limit}"} if failure.limit else {}
        return error(
            fmt,
            429,
            message,
            extra={"retryable": True, **({"limit": failure.limit} if failure.limit else {})},
            headers={**wait_headers(wait), "x-should-retry": "true", **named},
        )
    if failure is not None and failure.type == "budget_edge":
        # Not sent: only a cheaper target of another wire format fits what the budget has left
        # (§18.4). Not held, so no reset instant; an SDK's retry would be refused the same.
        return error(
            fmt, 429, message, extra={"retryable": False}, headers={"x-should-retry": "false"}
        )
    if result.outcome == "cut" and result.bound is not None:
        return error(
            fmt, 504, message, code=result.bound.value, extra={"bound": result.bound.value}
        )
    return error(
        fmt, 502, message, extra={"provider_error": failure.as_dict() if failure else None}
    )


def _json_passed(data: bytes, content_type: str) -> str | None:
    """A provider's error body as it is passed on, made safe; None when it is not JSON."""
    if "json" not in content_type.lower():
        return None
    text = data.decode("utf-8", "replace")
    try:
        untrusted_json(text)
    except ValueError:
        return None
    return untrusted_json_text(text)


def _relayed(event: SseEvent) -> bytes:
    """One of the provider's events as it goes on to the client, its data made safe; nothing
    for an event whose data is not a JSON object (nor ``[DONE]``): the call's own reading skips
    it as no model event, and the client's SDK would raise parsing it. (A framing check, not a
    parse: this runs for every event relayed.)"""
    if event.comment:
        return sse_bytes(event)
    data = event.data.strip()
    if not (data.startswith("{") and data.endswith("}")) and data != "[DONE]":
        return b""
    return sse_bytes(SseEvent(event.event, untrusted_json_text(event.data)))


# The provider's answers after which the stream gets an error event of ours: its own error
# frames are relayed as they came, but not these (an answer past what is kept of one ends
# with the error event, never with the stream's own end).
REFUSED_CODES = frozenset(
    {
        "bad_status",
        "bad_response",
        "response_too_large",
        "line_too_long",
        "event_too_large",
        "answer_too_large",
    }
)


async def relay(call: DropinCall, fmt: Format, seen: list[tuple[str, Any]]) -> AsyncIterator[bytes]:
    """The provider's events as they arrive, and a keepalive whenever nothing else went to the
    client for ``AGENTOPS_DROPIN_KEEPALIVE_MS`` (clients and load balancers cut quiet streams;
    a keepalive is the client's, never progress for the call's own bounds). Then, for a cut, a
    stream that broke off, an answer refused or an error answer that came after the stream
    started, one error event in the format's shape."""
    ended = False
    every_s = settings.AGENTOPS_DROPIN_KEEPALIVE_MS / 1000
    errored = False  # the provider answered an error status after the stream had started
    try:
        if not any(kind == "sse" for kind, _ in seen):
            yield fmt.keepalive()  # the client waited a keepalive's time already: it hears now
        arrived = seen
        while True:
            # What arrived together goes out in one write: a write per tiny event cost the
            # web process a system call each.
            relayed = b"".join(_relayed(value) for kind, value in arrived if kind == "sse")
            if relayed:
                yield relayed
            errored = errored or any(kind == "error_body" for kind, _ in arrived)
            if arrived and arrived[-1][0] == "end":
                break
            try:
                async with asyncio.timeout(every_s):
                    arrived = await call.arrived()
            except TimeoutError:
                arrived = []
                yield fmt.keepalive()
        ended = True
        result: CallResult | None = arrived[-1][1]
        failure = result.error if result is not None else None
        if result is None:
            yield fmt.stream_error(
                "the call could not be recorded (the database is unavailable)",
                code="unavailable",
            )
        elif result.outcome == "cut" and result.bound is not None and failure is not None:
            yield fmt.stream_error(failure.message, code=result.bound.value)
        elif failure is not None and (
            errored or failure.type == "network" or failure.provider_code in REFUSED_CODES
        ):
            yield fmt.stream_error(
                failure.message,
                code=failure.type if errored else failure.provider_code or failure.type,
            )
    finally:
        if not ended:
            call.abort()  # the client went away: the call ends, recorded as aborted
