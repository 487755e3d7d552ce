"""The drop-in endpoints behind ``Idempotency-Key`` (architecture.md §14.2): a wrapper around
``views.serve`` that claims the key before the call and records the answer after it, so a
repeat is answered from the record with no provider call.

What is recorded: the status, the headers a client reads (content type, request ids, retry
hints) and the body as the client got it; for a stream, the event bytes relayed (keepalives
left out), replayed as one SSE response. Only an answer the client would keep is recorded: a
completed call, or the provider's refusal of the request itself (a 4xx other than 408, 409,
429). A request refused before any call, a transient failure (5xx, 429, a cut) or a client gone
mid-answer releases the key: a retry under it calls again (no answer was received, so none is
paid twice). An answer over ``AGENTOPS_IDEMPOTENCY_RECORD_BYTES`` is not kept: its repeat is a
409 saying so."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Coroutine
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from agentops.exceptions import AgentopsError
from agentops.idempotency import (
    HEADER,
    REPLAYED_HEADER,
    Claim,
    answer_kept,
    body_hash,
    idempotency_key_answer,
    idempotency_key_check,
    idempotency_key_claim,
    idempotency_key_release,
)
from interfaces.dropin import views
from interfaces.dropin.formats import ANTHROPIC, OPENAI, RESPONSES, Format, error
from interfaces.edge import runtime_of
from turns.dropin import DropinCall
from turns.runtime import Found, TurnRuntime

# The response headers a replay gives back, when the first answer had them.
RECORDED_HEADERS = (
    "content-type",
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
    "x-request-id",
    "request-id",
)


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponseBase:
    return await idempotent(request, OPENAI)


@csrf_exempt
async def messages(request: HttpRequest) -> HttpResponseBase:
    return await idempotent(request, ANTHROPIC)


@csrf_exempt
async def responses(request: HttpRequest) -> HttpResponseBase:
    return await idempotent(request, RESPONSES)


async def idempotent(request: HttpRequest, fmt: Format) -> HttpResponseBase:
    """``views.serve``, with the key claimed first and the answer recorded after."""
    rt = runtime_of(request)  # what the request's call and its hops go through
    db = rt.db
    raw = request.headers.get(HEADER)
    if raw is None or request.method != "POST":
        return await views.serve(rt, request, fmt)  # no key: nothing more than before
    try:
        body = request.body
    except RequestDataTooBig:
        return await views.serve(rt, request, fmt)  # its 413
    try:
        claim = await db(_claim, rt.found, views.presented_token(request), raw, fmt, body)
    except AgentopsError as exc:
        return error(fmt, exc.status, exc.message, extra={"param": HEADER})
    if claim is None:
        return await views.serve(rt, request, fmt)  # no valid token: its 401
    if claim.kind == "replay":
        assert claim.row is not None
        return _replayed(claim.row.response_status or 200, claim.row)
    try:
        response = await views.serve(rt, request, fmt)
    except BaseException:
        _later(rt, db(idempotency_key_release, row_id=claim.row_id))
        raise
    call: DropinCall | None = request.META.get(views.CALL_META)
    if call is None:  # refused before any call
        await db(idempotency_key_release, row_id=claim.row_id)
        return response
    if isinstance(response, StreamingHttpResponse):
        response.streaming_content = _recording(
            rt,
            response.streaming_content,  # type: ignore[arg-type]
            fmt=fmt,
            call=call,
            row_id=claim.row_id,
            headers=_kept(response),
        )
        return response
    assert isinstance(response, HttpResponse)
    status = response.status_code
    completed = call.result is not None and call.result.outcome == "completed"
    if not answer_kept(completed=completed, provider_status=status):
        await db(idempotency_key_release, row_id=claim.row_id)
        return response
    content = response.content
    await db(
        idempotency_key_answer,
        row_id=claim.row_id,
        status=status,
        headers=_kept(response),
        body=content if len(content) <= settings.AGENTOPS_IDEMPOTENCY_RECORD_BYTES else None,
    )
    return response


def _claim(found: Found, token_text: str, raw: str, fmt: Format, body: bytes) -> Claim | None:
    """The token (None when not valid: the endpoint's 401 follows), then the key claimed."""
    token = views.token_found(found, token_text)
    if token is None:
        return None
    key = idempotency_key_check(raw)
    assert key is not None
    return idempotency_key_claim(
        token_id=token.pk,
        key=key,
        endpoint=f"POST {fmt.path}",
        digest=body_hash(endpoint=f"POST {fmt.path}", body=body),
        agent=_model(body),
        now=timezone.now(),
    )


def _model(body: bytes) -> str:
    """The agent the body names, for the record ('' when it names none: its 400 follows)."""
    try:
        model = json.loads(body).get("model")
    except (ValueError, AttributeError):
        return ""
    return model if isinstance(model, str) else ""


def _kept(response: HttpResponseBase) -> dict[str, str]:
    return {name: response[name] for name in RECORDED_HEADERS if response.has_header(name)}


def _replayed(status: int, row: Any) -> HttpResponseBase:
    headers = {**row.response_headers, REPLAYED_HEADER: "true"}
    body = bytes(row.response_body or b"")
    if row.streamed:
        headers.pop("content-type", None)
        return StreamingHttpResponse(
            _once(body),
            status=status,
            content_type="text/event-stream; charset=utf-8",
            headers={**views.STREAM_HEADERS, **headers},
        )
    content_type = headers.pop("content-type", "application/json")
    return HttpResponse(body, status=status, content_type=content_type, headers=headers)


async def _once(body: bytes) -> AsyncIterator[bytes]:
    yield body


# The event that ends a complete answer in each format, as relayed: the record is written
# before it goes out, so a client that read it and repeats at once finds the answer recorded
# (SDKs close the connection on it, without waiting for the response's end).
TERMINAL = {
    OPENAI.kind: b"data: [DONE]\n",
    ANTHROPIC.kind: b"event: message_stop\n",
    RESPONSES.kind: b"event: response.completed\n",
}


def _ends_answer(chunk: bytes, terminal: bytes) -> bool:
    """Whether ``chunk`` holds the terminal event as an event of its own: at the start of a
    line that starts an event (a model's text saying "data: [DONE]" is inside a JSON string,
    never at a line's start, as JSON escapes newlines)."""
    return chunk.startswith(terminal) or b"\n\n" + terminal in chunk


async def _recording(
    rt: TurnRuntime,
    content: AsyncIterator[bytes],
    *,
    fmt: Format,
    call: DropinCall,
    row_id: int,
    headers: dict[str, str],
) -> AsyncIterator[bytes]:
    """The stream as it goes to the client, its events kept (up to the record's bound) and
    recorded once the answer is complete: before its terminal event is relayed, or at the end
    of a completed call whose provider sent none."""
    kept: list[bytes] = []
    size = 0
    limit = settings.AGENTOPS_IDEMPOTENCY_RECORD_BYTES
    keepalive, terminal = fmt.keepalive(), TERMINAL[fmt.kind]
    settled = False  # recorded or released

    async def record() -> None:
        await rt.db(
            idempotency_key_answer,
            row_id=row_id,
            status=200,
            headers=headers,
            body=b"".join(kept) if size <= limit else None,
            streamed=True,
        )

    try:
        async for chunk in content:
            if chunk != keepalive and not settled:
                size += len(chunk)
                if size <= limit:
                    kept.append(chunk)
                if _ends_answer(chunk, terminal):
                    await record()
                    settled = True
            yield chunk
        if not settled:
            if call.result is not None and call.result.outcome == "completed":
                await record()
            else:
                await rt.db(idempotency_key_release, row_id=row_id)
            settled = True
    finally:
        if not settled:  # the client went away before the answer was complete
            _later(rt, rt.db(idempotency_key_release, row_id=row_id))


def _later(rt: TurnRuntime, work: Awaitable[Any]) -> None:
    """Start ``work`` where nothing can wait for it (a request cancelled), kept until done."""
    assert isinstance(work, Coroutine)
    rt.keep_until_done(asyncio.get_running_loop().create_task(work))
