"""Scenario playback: what the stand-in sends for one provider request.

:func:`play_scenario` turns a parsed scenario (:mod:`devtools.standin.scenarios`)
into the response on one :class:`~devtools.standin.exchange.Exchange`: the
reply, the pauses between frames, keepalives, silence, trickled bytes, errors
with their retry hints.  The request's wire format object
(:mod:`devtools.standin.openai_wire` or :mod:`devtools.standin.anthropic_wire`)
builds the bodies and frames; this module decides what to send and when.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterable
from typing import Any

from devtools.standin.anthropic_wire import AnthropicWire
from devtools.standin.exchange import Exchange
from devtools.standin.openai_wire import OpenAIWire
from devtools.standin.responses_wire import ResponsesWire
from devtools.standin.scenarios import KEEPALIVE_SCENARIOS, Scenario, parse_scenario
from devtools.standin.wire import (
    KEEPALIVE_COMMENT,
    Frames,
    Headers,
    Reply,
    ToolCall,
    contains_marker,
    default_answer_text,
    default_error_message,
    dumps,
    estimate_tokens,
    first_tool_name,
    last_tool_result,
    last_user_text,
    pad_message,
    retry_hints,
    signature,
    split_text,
)

#: The wire format object of one request (the app picks it by the request path).
Wire = OpenAIWire | AnthropicWire

#: A streamed reply as a sequence of steps: frames to send, or a pause (seconds).
Step = Frames | float


def _json_headers(wire: Wire) -> Headers:
    return [(b"content-type", b"application/json"), wire.request_id_header()]


def _sse_headers(wire: Wire) -> Headers:
    return [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
        wire.request_id_header(),
    ]


def _ids(wire: Wire) -> Headers:
    return [wire.request_id_header()]


async def play_scenario(
    ex: Exchange,
    wire: Wire,
    sc: Scenario,
    body: dict[str, Any],
    stream: bool,
    counters: dict[str, int],
) -> None:
    """Answer one provider request on ``ex`` as the scenario ``sc`` says.

    ``counters`` are the app's request counts per exact scenario string (for
    ``times`` and ``sequence``; ``DELETE /_standin/requests`` clears them).
    """
    kind = sc.kind
    if "cache_read" in sc.params:  # answer and think: the usage they report
        wire.cache_read, wire.cache_write = sc.get_int("cache_read"), sc.get_int("cache_write")
    if kind == "sequence":
        # The n-th request carrying this exact scenario plays step n; the last step repeats.
        count = counters.get(sc.raw, 0) + 1
        counters[sc.raw] = count
        steps = sc.get_opt_str("steps").split("|")  # type: ignore[union-attr]
        chosen = parse_scenario(steps[min(count, len(steps)) - 1])
        await play_scenario(ex, wire, chosen, body, stream, counters)
    elif kind == "answer":
        reply = Reply(
            text=sc.get_opt_str("text") or default_answer_text(body),
            text_chunks=sc.get_int("chunks"),
        )
        await _deliver(ex, wire, reply, stream, sc.seconds("interval_ms"), sc.seconds("delay_ms"))
    elif kind == "think":
        if last_tool_result(body) is not None:
            thought = "Thinking about the tool result."
        else:
            thought = f"Thinking about: {last_user_text(body)[:200]}"
        reply = Reply(
            text=sc.get_opt_str("text") or default_answer_text(body),
            text_chunks=sc.get_int("chunks"),
            thinking=thought,
            thinking_chunks=sc.get_int("thinking_chunks"),
        )
        await _deliver(
            ex,
            wire,
            reply,
            stream,
            sc.seconds("interval_ms"),
            sc.seconds("delay_ms"),
            silent=sc.seconds("silent_ms"),
        )
    elif kind == "tool":
        if last_tool_result(body) is not None:
            reply = Reply(text=default_answer_text(body), text_chunks=3)
        else:
            name = sc.get_opt_str("name") or first_tool_name(body) or "lookup"
            arguments = sc.get_opt_object("arguments")
            if arguments is None:
                arguments = {"query": last_user_text(body)[:200]}
            reply = Reply(tool=ToolCall(name, arguments), stop="tool")
        await _deliver(ex, wire, reply, stream, sc.seconds("interval_ms"), sc.seconds("delay_ms"))
    elif kind in KEEPALIVE_SCENARIOS:
        await _keepalives(ex, wire, sc, body, stream)
    elif kind == "silent":
        await _silent(ex, wire, body, stream, after_chunks=None)
    elif kind == "silent-after-content":
        ex.interval = sc.seconds("interval_ms")
        await _silent(
            ex,
            wire,
            body,
            stream,
            after_chunks=sc.get_int("after_chunks"),
            pings=sc.seconds("pings_ms"),
        )
    elif kind == "trickle":
        await _trickle(ex, wire, sc, body, stream)
    elif kind == "endless":
        await _endless(ex, wire, sc, stream)
    elif kind == "error":
        await _error(ex, wire, sc, body, stream, counters)
    elif kind == "refuse":
        message = sc.get_opt_str("message") or "temperature is not supported with this model"
        code = "unsupported_parameter" if wire.api == "openai" else None
        await ex.respond_json(400, wire.error_body(400, message, code=code), _ids(wire))
    elif kind == "poison":
        marker = sc.get_str("marker")
        if contains_marker(body, marker):
            # Never echo the marker: the failure note quotes this message, and a note that
            # carried the marker would poison the history the breaker is trying to clear.
            message = "Invalid request: the conversation contains content this model refuses."
            await ex.respond_json(400, wire.error_body(400, message), _ids(wire))
        else:
            reply = Reply(text=default_answer_text(body), text_chunks=3)
            await _deliver(ex, wire, reply, stream, 0.01, 0.0)
    elif kind == "context-length":
        await _context_length(ex, wire, body)
    elif kind == "compact":
        await ex.respond_json(200, _compacted(wire, body), _ids(wire))
    elif kind == "window":
        await _window(ex, wire, sc, body, stream)
    elif kind == "auth":
        await _auth(ex, wire, body)
    elif kind == "length-empty":
        await _deliver(ex, wire, Reply(text="", stop="length"), stream, 0.01, 0.0)
    elif kind == "hang":
        await ex.wait_gone()
    else:  # pragma: no cover - the scenario table and this dispatch disagree
        raise RuntimeError(f"scenario {kind!r} has no implementation")


# -- normal replies ----------------------------------------------------
def _reply_steps(wire: Wire, reply: Reply, silent: float = 0.0) -> list[Step]:
    """Stream steps after the stream start, through the finish frames."""
    steps: list[Step] = []
    if reply.thinking is not None:
        steps.append(wire.thinking_start())
        if silent > 0:
            steps.append(silent)
        for piece in split_text(reply.thinking, reply.thinking_chunks):
            steps.append(wire.thinking_delta(piece))
        steps.append(wire.thinking_end(signature(reply.thinking)))
    for piece in split_text(reply.text, reply.text_chunks):
        steps.append(wire.text_delta(piece))
    if reply.tool is not None:
        steps.append(wire.tool_start(wire.new_tool_id(), reply.tool.name))
        for piece in split_text(json.dumps(reply.tool.arguments), 3):
            steps.append(wire.tool_delta(piece))
    steps.append(wire.finish(reply.stop))
    return steps


async def _play(ex: Exchange, steps: Iterable[Step]) -> bool:
    for step in steps:
        if isinstance(step, float):
            if not await ex.sleep(step):
                return False
        elif not await ex.emit(step):
            return False
    await ex.end()
    return True


async def _deliver(
    ex: Exchange,
    wire: Wire,
    reply: Reply,
    stream: bool,
    interval: float,
    delay: float,
    *,
    silent: float = 0.0,
) -> None:
    if delay > 0 and not await ex.sleep(delay):
        return
    if not stream:
        await ex.respond_json(200, wire.completion(reply), _ids(wire))
        return
    if not await ex.start(200, _sse_headers(wire)):
        return
    ex.interval = interval
    await _play(ex, [wire.start(), *_reply_steps(wire, reply, silent)])


# -- keepalives, silence, trickles -------------------------------------
async def _keepalives(
    ex: Exchange, wire: Wire, sc: Scenario, body: dict[str, Any], stream: bool
) -> None:
    if not stream:
        await ex.wait_gone()
        return
    if not await ex.start(200, _sse_headers(wire)) or not await ex.emit(wire.start()):
        return
    interval = sc.seconds("interval_ms")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + sc.seconds("duration_ms")
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            break
        if not await ex.sleep(min(interval, remaining)):
            return
        if loop.time() >= deadline:
            break
        frames: Frames
        if sc.kind == "pings":
            frames = wire.ping()
        elif sc.kind == "comments":
            frames = [KEEPALIVE_COMMENT]
        else:
            frames = wire.empty_delta()
        if not await ex.emit(frames):
            return
    ex.interval = 0.01
    await _play(ex, _reply_steps(wire, Reply(text=default_answer_text(body))))


async def _silent(
    ex: Exchange,
    wire: Wire,
    body: dict[str, Any],
    stream: bool,
    after_chunks: int | None,
    pings: float = 0.0,
) -> None:
    if stream:
        if not await ex.start(200, _sse_headers(wire)):
            return
        frames = wire.start()
        for i in range(after_chunks or 0):
            frames += wire.text_delta("Stand-in partial answer " if i == 0 else f"part {i} ")
        if not await ex.emit(frames):
            return
    else:
        if not await ex.start(200, _json_headers(wire)):
            return
        if after_chunks:
            data = dumps(wire.completion(Reply(text=default_answer_text(body))))
            if not await ex.body(data[: len(data) // 2]):
                return
    # Keepalives (pings) during the silence, if asked: they must not keep the call alive.
    while stream and pings > 0 and await ex.sleep(pings):
        if not await ex.emit(wire.ping()):
            return
    await ex.wait_gone()


async def _trickle(
    ex: Exchange, wire: Wire, sc: Scenario, body: dict[str, Any], stream: bool
) -> None:
    interval = sc.seconds("interval_ms")
    step = sc.get_int("bytes")
    sends = math.ceil(sc.get_int("duration_ms") / sc.get_int("interval_ms"))
    reply = Reply(text=default_answer_text(body))
    if not stream:
        data = dumps(wire.completion(reply))
        total = max(len(data), sends * step)
        data = data[:1] + b" " * (total - len(data)) + data[1:]
        headers = [*_json_headers(wire), (b"content-length", str(total).encode())]
        if not await ex.start(200, headers):
            return
        for pos in range(0, total, step):
            if not await ex.sleep(interval) or not await ex.body(data[pos : pos + step]):
                return
        await ex.end()
        return
    if not await ex.start(200, _sse_headers(wire)):
        return
    pattern = b":\n"
    sent = 0
    for _ in range(sends):
        if not await ex.sleep(interval):
            return
        piece = bytes(pattern[(sent + i) % 2] for i in range(step))
        if not await ex.body(piece):
            return
        sent += step
    if sent % 2 and not await ex.body(b"\n"):  # finish the comment line
        return
    ex.interval = 0.01
    await _play(ex, [wire.start(), *_reply_steps(wire, reply)])


async def _endless(ex: Exchange, wire: Wire, sc: Scenario, stream: bool) -> None:
    if not stream:
        await ex.wait_gone()
        return
    if not await ex.start(200, _sse_headers(wire)) or not await ex.emit(wire.start()):
        return
    ex.interval = sc.seconds("interval_ms")
    count = 0
    while await ex.emit(wire.text_delta(f"word{count} ")):
        count += 1


# -- errors ------------------------------------------------------------
async def _error(
    ex: Exchange,
    wire: Wire,
    sc: Scenario,
    body: dict[str, Any],
    stream: bool,
    counters: dict[str, int],
) -> None:
    count = counters.get(sc.raw, 0) + 1
    counters[sc.raw] = count
    times = sc.get_opt_int("times")
    if times is not None and count > times:
        reply = Reply(text=default_answer_text(body), text_chunks=3)
        await _deliver(ex, wire, reply, stream, 0.01, 0.0)
        return
    delay = sc.seconds("delay_ms")
    if delay > 0:
        await asyncio.sleep(delay)  # the answer is on its way: nothing is sent before it
    status = sc.get_int("status")
    form = sc.get_str("form")
    code = sc.get_opt_str("code")
    type_ = sc.get_opt_str("type")
    message = sc.get_opt_str("message")
    if message is None:
        message = default_error_message(status)
    message = pad_message(message, sc.get_opt_int("size"))
    headers, extra = retry_hints(form, sc.get_float("wait_ms"))
    if wire.api == "openai":
        error = wire.error_body(status, message, code=code, type_=type_, extra=extra)
    else:
        error = wire.error_body(status, message, type_=type_ or code, extra=extra)
    if form == "frame" and stream:
        if not await ex.start(200, _sse_headers(wire)):
            return
        ex.interval = 0.01
        frames = wire.start() + wire.text_delta("Stand-in partial answer ")
        if await ex.emit(frames) and await ex.emit(wire.error_frame(error)):
            await ex.end()
        return
    await ex.respond_json(status, error, [*headers, *_ids(wire)])


async def _context_length(ex: Exchange, wire: Wire, body: dict[str, Any]) -> None:
    if wire.api == "openai":
        limit = 128000
        used = max(limit + 1873, estimate_tokens(json.dumps(body.get("messages", ""))))
        message = (
            f"This model's maximum context length is {limit} tokens. However, your messages "
            f"resulted in {used} tokens. Please reduce the length of the messages."
        )
        error = wire.error_body(400, message, code="context_length_exceeded", param="messages")
    else:
        limit = 200000
        used = max(limit + 1873, estimate_tokens(json.dumps(body.get("messages", ""))))
        message = f"prompt is too long: {used} tokens > {limit} maximum"
        error = wire.error_body(400, message)
    await ex.respond_json(400, error, _ids(wire))


# What a provider's own server-side compaction puts in an answer, as the stand-in plays it: an
# Anthropic compaction content block with the context management applied, an OpenAI Responses
# compaction output item. Opaque to agentops: the drop-ins pass them on as they came.
ANTHROPIC_COMPACTION = {"type": "compaction", "content": "Earlier: the user asked for a plan."}
ANTHROPIC_CONTEXT_MANAGEMENT = {"applied_edits": [{"type": "compact_20260112"}]}
RESPONSES_COMPACTION = {
    "type": "compaction",
    "id": "cmp_standin",
    "encrypted_content": "gAAAAABstandin-opaque==",
}


def _compacted(wire: Wire, body: dict[str, Any]) -> dict[str, Any]:
    """A non-streamed answer carrying the provider's compaction items (``compact``)."""
    answer = wire.completion(Reply(text=default_answer_text(body), text_chunks=1))
    if isinstance(wire, AnthropicWire):
        answer["content"].insert(0, dict(ANTHROPIC_COMPACTION))
        answer["context_management"] = dict(ANTHROPIC_CONTEXT_MANAGEMENT)
    elif isinstance(wire, ResponsesWire):
        answer["output"].insert(0, dict(RESPONSES_COMPACTION))
    return answer


async def _window(
    ex: Exchange, wire: Wire, sc: Scenario, body: dict[str, Any], stream: bool
) -> None:
    """A model with a window of ``tokens``: a request whose messages (the count its usage
    reports) plus its ``max_tokens`` are over it is refused in the provider's own words;
    any other is answered (with ``tool=1``, a user's message with a tool call first)."""
    limit = sc.get_int("tokens")
    marker = sc.get_opt_str("refuse_marker")
    if marker is not None and contains_marker(body, marker):
        message = "Invalid request: the conversation contains content this model refuses."
        await ex.respond_json(400, wire.error_body(400, message), _ids(wire))
        return
    used = estimate_tokens(json.dumps(body.get("messages", "")))
    if isinstance(body.get("system"), str):
        used += estimate_tokens(body["system"])
    # A denser tokenizer than four characters a token: counted, refused and reported alike.
    used *= sc.get_int("density")
    if isinstance(wire, AnthropicWire):
        wire.input_tokens = used
    else:
        wire.prompt_tokens = used
    reserve = body.get("max_tokens") or body.get("max_output_tokens") or 0
    reserve = reserve if isinstance(reserve, int) else 0
    if used + reserve <= limit:
        reply = Reply(text=sc.get_opt_str("text") or default_answer_text(body), text_chunks=2)
        if sc.get_int("tool") and last_tool_result(body) is None:
            name = first_tool_name(body) or "lookup"
            reply = Reply(tool=ToolCall(name, {"query": last_user_text(body)[:40]}), stop="tool")
        await _deliver(ex, wire, reply, stream, 0.0, 0.0)
        return
    if wire.api == "openai":
        message = (
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{used + reserve} tokens ({used} in the messages, {reserve} in the completion). "
            "Please reduce the length of the messages or completion."
        )
        error = wire.error_body(400, message, code="context_length_exceeded", param="messages")
    else:
        message = f"prompt is too long: {used + reserve} tokens > {limit} maximum"
        error = wire.error_body(400, message)
    await ex.respond_json(400, error, _ids(wire))


async def _auth(ex: Exchange, wire: Wire, body: dict[str, Any]) -> None:
    if wire.api == "openai":
        message = (
            "Incorrect API key provided: sk-stan****dein. You can find your API key at "
            "https://platform.openai.com/account/api-keys."
        )
    else:
        message = "invalid x-api-key"
    await ex.respond_json(401, wire.error_body(401, message), _ids(wire))
