"""A provider that misbehaves on purpose: a small HTTP/1.1 server on loopback, written on raw
asyncio streams so it can send what no well-made server would (architecture.md §15). It answers
``POST .../chat/completions`` in the OpenAI wire format; the request's ``model`` picks the
misbehaviour:

- ``answer``: a plain answer (streamed or not, as asked), for comparison;
- ``gzip-bomb``: a small gzip body that inflates to 1 GiB (an SSE line of zeros when streamed);
- ``repeated-header``: one header 20,000 times; ``endless-headers``: header lines until the
  client goes away; ``trickle-headers``: the same header line every 0.2 s (as many as fit in
  the header limits in 25 s);
- ``huge-body``: a 300 MB answer; ``long-line``: a stream whose one line runs 100 MB;
- ``nul``: an answer whose text holds NUL and a lone surrogate (escaped in JSON) and a raw NUL
  byte (in an SSE comment when streamed); ``bad-utf8``: an answer with bytes that are not UTF-8;
  ``nul-error``: a 400 whose body (not JSON) holds a raw NUL byte and invalid UTF-8;
  ``tool-args-N``: a streamed tool call whose arguments run N MiB, in 512 KiB deltas;
  ``text-N``: a streamed answer of N MiB of text in 512 KiB deltas, then its usage and end;
  ``esc-error``: a 400 whose JSON error message and code hold ESC sequences, a bell and a CR;
- ``status-999``: ``HTTP/1.1 999``; ``redirect``: a 302; ``html-error``: a 502 HTML page;
- ``two-responses``: two answers in one write (only the first was asked for);
- ``close-mid-chunk``: a stream cut off inside a chunk; ``close-after-headers``: a stream's
  headers, then the connection closed;
- ``big-usage``: an answer reporting more tokens than any column holds, and a stop reason
  longer than its column;
- ``flood-N``: a stream of N one-character content deltas as fast as the socket takes them,
  then its end; ``flood-comments-N``: N comment lines (keepalives), then an answer;
- ``data-no-blank``: ``data:`` lines of a KiB with no blank line between them, 200 MiB of them
  (one event that never ends) unless the client goes away first;
- ``fault:NAME:TIMES`` (``TIMES`` a count or ``all``; ``fault:NAME:TIMES:TAG`` for two models
  that play the same): the first TIMES requests with this exact model play the fault NAME,
  later ones get a 60-token answer (``tokens-60``, as asked):
  ``429-wait-2`` (429, ``retry-after: 2``), ``503-wait-2`` (the same as a 503), ``429`` (no
  wait), ``500``, ``503`` (no wait),
  ``reset`` (a TCP reset before any header), ``first-token-MS`` (2xx headers at once, then
  nothing for MS ms, then the answer), ``cut-40`` (40 of the 60 tokens, then the connection
  drops), ``stall-20`` (20 tokens, then silence for 30 s), ``malformed`` (one ``data:`` line
  that is not JSON among the 60 tokens), ``no-done`` (the 60 tokens and their stop without
  ``data: [DONE]``), ``content-filter`` (400, OpenAI's ``content_filter``);
- ``outage:MS`` (any suffix after another ``:``): 503 for MS ms from this model's first request,
  then the 60-token answer (an outage in time, not in requests).

``GET /_hostile/requests`` lists the requests received (model, stream),
``GET /_hostile/connections`` counts connections and ``GET /_hostile/floods`` lists the floods
sent (``flood``); ``DELETE /_hostile/requests`` clears them all.
Run it with ``python -m tests.hostile --port 0``; it prints ``hostile listening on URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import time
import zlib
from functools import cache
from typing import Any

GiB = 1 << 30
received: list[dict[str, Any]] = []
# When each ``outage:`` model was first asked (monotonic seconds).
outages: dict[str, float] = {}
floods: list[dict[str, Any]] = []
connections = 0


def answer_json(text: str, **extra: Any) -> bytes:
    body = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "created": 0,
        "model": "hostile",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
    }
    body.update(extra)
    return json.dumps(body).encode()


def chunk_event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    data = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "hostile",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(data).encode() + b"\n\n"


async def tool_arguments(writer: asyncio.StreamWriter, size: int) -> None:
    """A streamed tool call whose JSON arguments (one string value) run ``size`` bytes."""
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "save"}}
    writer.write(
        head("200 OK", [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")])
    )
    parts = [chunk_event({"tool_calls": [{**call, "function": {"name": "save", "arguments": ""}}]})]
    parts.append(chunk_event({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": "'}}]}))
    step = 512 * 1024
    for _ in range(size // step):
        parts.append(
            chunk_event({"tool_calls": [{"index": 0, "function": {"arguments": "y" * step}}]})
        )
        writer.write(chunks(parts))
        parts = []
        await writer.drain()
    parts.append(chunk_event({"tool_calls": [{"index": 0, "function": {"arguments": '"}'}}]}))
    parts.append(chunk_event({}, finish="tool_calls"))
    parts.append(b"data: [DONE]\n\n")
    writer.write(chunked(parts))
    await writer.drain()


async def long_text(writer: asyncio.StreamWriter, size: int, model: str) -> None:
    """A streamed answer whose text runs ``size`` bytes, then its usage, stop and ``[DONE]``;
    noted in ``floods`` as a flood is (``sent``: the text's deltas the socket took)."""
    note: dict[str, Any] = {"model": model, "sent": 0, "gone_at": None, "done_at": None}
    floods.append(note)
    writer.write(
        head("200 OK", [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")])
    )
    step = 512 * 1024
    try:
        for _ in range(size // step):
            writer.write(chunks([chunk_event({"content": "z" * step})]))
            await writer.drain()
            note["sent"] += 1
        usage = {"prompt_tokens": 3, "completion_tokens": size // 4, "total_tokens": size // 4 + 3}
        end = b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
        writer.write(chunked([chunk_event({}, finish="stop"), end, b"data: [DONE]\n\n"]))
        await writer.drain()
    except ConnectionError:
        note["gone_at"] = time.time()
        raise
    note["done_at"] = time.time()


def head(status: str, headers: list[tuple[str, str]]) -> bytes:
    return (
        f"HTTP/1.1 {status}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    ).encode("latin-1")


def whole(
    status: str,
    body: bytes,
    content_type: str = "application/json",
    extra: list[tuple[str, str]] | None = None,
) -> bytes:
    return (
        head(
            status,
            [("content-type", content_type), ("content-length", str(len(body))), *(extra or [])],
        )
        + body
    )


def chunks(parts: list[bytes]) -> bytes:
    """``parts`` as chunks of a chunked body, without its end."""
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p)


def chunked(parts: list[bytes]) -> bytes:
    return chunks(parts) + b"0\r\n\r\n"


def sse(parts: list[bytes]) -> bytes:
    return head(
        "200 OK", [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")]
    ) + chunked(parts)


FLOOD_BLOCK = 1000  # events per write: the socket, not the writes, sets the pace
FLOOD_DELTA = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'


async def flood(writer: asyncio.StreamWriter, unit: bytes, count: int, model: str) -> None:
    """``unit`` ``count`` times in chunks of FLOOD_BLOCK, then a stop and ``[DONE]``; noted in
    ``floods``: how many were sent, and when (wall clock) the client went away or it ended."""
    note: dict[str, Any] = {"model": model, "sent": 0, "gone_at": None, "done_at": None}
    floods.append(note)
    writer.write(
        head("200 OK", [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")])
    )
    block = unit * FLOOD_BLOCK
    full, rest = divmod(count, FLOOD_BLOCK)
    try:
        for part in [block] * full + [unit * rest]:
            if part:
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
                note["sent"] += len(part) // len(unit)
        writer.write(chunked([chunk_event({}, "stop"), b"data: [DONE]\n\n"]))
        await writer.drain()
    except ConnectionError:
        note["gone_at"] = time.time()
        raise
    note["done_at"] = time.time()


@cache
def bomb(streamed: bool) -> bytes:
    """1 GiB of zeros (after ``data: `` when streamed), gzip-compressed to about a megabyte."""
    squeeze = zlib.compressobj(1, zlib.DEFLATED, 31)
    zeros = b"0" * (1 << 20)
    parts = [squeeze.compress(b"data: ")] if streamed else []
    parts += [squeeze.compress(zeros) for _ in range(GiB >> 20)]
    parts.append(squeeze.flush())
    return b"".join(parts)


def tokens(count: int, *, done: bool = True) -> list[bytes]:
    """A streamed answer of ``count`` one-token deltas, its stop and (``done``) ``[DONE]``."""
    events = [chunk_event({"role": "assistant", "content": ""})]
    events += [chunk_event({"content": f"t{i} "}) for i in range(count)]
    events.append(chunk_event({}, "stop"))
    return events + ([b"data: [DONE]\n\n"] if done else [])


STREAM_HEAD = head(
    "200 OK", [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")]
)


def chunk(part: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(part), part)


def error_json(status: str, message: str, kind: str, code: str | None, **extra: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    return whole(status, body.encode(), extra=list(extra.items()))


async def fault(name: str, streamed: bool, writer: asyncio.StreamWriter) -> bool:
    """Play the fault ``name`` (``fault:NAME:TIMES``); False when the connection must close."""
    if name == "429-wait-2":
        writer.write(
            error_json(
                "429 Too Many Requests",
                "Rate limit reached",
                "requests",
                "rate_limit_exceeded",
                **{"retry-after": "2"},
            )
        )
        return True
    if name == "503-wait-2":
        writer.write(
            error_json(
                "503 Service Unavailable",
                "The engine is currently overloaded",
                "server_error",
                None,
                **{"retry-after": "2"},
            )
        )
        return True
    if name == "429":
        writer.write(
            error_json(
                "429 Too Many Requests", "Rate limit reached", "requests", "rate_limit_exceeded"
            )
        )
        return True
    if name in ("500", "503"):
        status = "500 Internal Server Error" if name == "500" else "503 Service Unavailable"
        writer.write(error_json(status, "The server had an error", "server_error", None))
        return True
    if name == "content-filter":
        writer.write(
            error_json(
                "400 Bad Request",
                "The response was filtered due to the prompt triggering the content policy",
                "invalid_request_error",
                "content_filter",
            )
        )
        return True
    if name == "reset":
        # SO_LINGER 0: closing sends a RST, as a crashed or overloaded balancer does.
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
        return False
    if not streamed:
        writer.write(whole("200 OK", answer_json(" ".join(f"t{i}" for i in range(60)))))
        return True
    events = tokens(60)
    if name.startswith("first-token-"):
        writer.write(STREAM_HEAD)
        await writer.drain()
        await asyncio.sleep(int(name.rsplit("-", 1)[1]) / 1000)
        writer.write(chunked(events))
        return True
    if name in ("cut-40", "stall-20"):
        count = 40 if name == "cut-40" else 20
        writer.write(STREAM_HEAD + b"".join(chunk(e) for e in events[: count + 1]))
        await writer.drain()
        if name == "stall-20":
            await asyncio.sleep(30)
        return False  # the connection drops without the chunked terminator
    if name == "malformed":
        events.insert(30, b'data: {"choices":[{"index":0,"delta":{"content":\n\n')
    if name == "no-done":
        events = tokens(60, done=False)
    writer.write(STREAM_HEAD + chunked(events))
    return True


async def respond(model: str, streamed: bool, writer: asyncio.StreamWriter) -> bool:
    """Answer one request; False when the connection must close after it."""
    if model.startswith("outage:"):
        began = outages.setdefault(model, time.monotonic())
        down = (time.monotonic() - began) * 1000 < int(model.split(":")[1])
        return await fault("503" if down else "tokens-60", streamed, writer)
    if model.startswith("fault:"):
        _, name, times, *_ = model.split(":")  # a fourth part tells two models apart
        # received holds this request already: it is request number ``seen`` of this model.
        seen = sum(1 for r in received if r["model"] == model)
        if times == "all" or seen <= int(times):
            return await fault(name, streamed, writer)
        return await fault("tokens-60", streamed, writer)
    if model == "answer":
        if streamed:
            writer.write(
                sse(
                    [
                        chunk_event({"role": "assistant", "content": "Hello"}),
                        chunk_event({"content": " there"}),
                        chunk_event({}, "stop"),
                        b"data: [DONE]\n\n",
                    ]
                )
            )
        else:
            writer.write(whole("200 OK", answer_json("Hello there")))
        return True
    if model == "gzip-bomb":
        body = bomb(streamed)
        content_type = "text/event-stream" if streamed else "application/json"
        writer.write(
            head(
                "200 OK",
                [
                    ("content-type", content_type),
                    ("content-encoding", "gzip"),
                    ("content-length", str(len(body))),
                ],
            )
            + body
        )
        return False
    if model == "repeated-header":
        writer.write(
            b"HTTP/1.1 200 OK\r\n"
            + b"x-junk: a\r\n" * 20_000
            + b"content-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        )
        return False
    if model == "trickle-headers":
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(120):
            writer.write(b"x-slow: v\r\n")
            await writer.drain()
            await asyncio.sleep(0.2)
        return False
    if model == "endless-headers":
        writer.write(b"HTTP/1.1 200 OK\r\n")
        for i in range(10_000_000):
            writer.write(b"x-h%d: v\r\n" % i)
            if i % 1000 == 0:
                await writer.drain()
        return False
    if model == "huge-body":
        size = 300 * 1000 * 1000
        writer.write(
            head("200 OK", [("content-type", "application/json"), ("content-length", str(size))])
        )
        block = b"x" * (1 << 20)
        sent = 0
        while sent < size:
            part = block[: size - sent]
            writer.write(part)
            sent += len(part)
            await writer.drain()
        return False
    if model == "long-line":
        writer.write(
            head(
                "200 OK",
                [("content-type", "text/event-stream"), ("content-length", str(100 * 1000 * 1000))],
            )
            + b"data: "
        )
        block = b"y" * (1 << 20)
        for _ in range(100):
            writer.write(block)
            await writer.drain()
        return False
    if model.startswith("flood-comments-"):
        await flood(writer, b": keepalive\n", int(model.rsplit("-", 1)[1]), model)
        return True
    if model.startswith("flood-"):
        await flood(writer, FLOOD_DELTA, int(model.rsplit("-", 1)[1]), model)
        return True
    if model == "data-no-blank":
        writer.write(
            head(
                "200 OK", [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")]
            )
        )
        line = b"data: " + b"z" * 1018 + b"\n"
        block = line * 1024
        for _ in range(200):
            writer.write(b"%x\r\n%s\r\n" % (len(block), block))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        return False
    if model == "nul":
        text = "a\u0000b\ud800c"
        if streamed:
            writer.write(
                sse(
                    [
                        b": ping \x00\n\n",
                        chunk_event({"role": "assistant", "content": text}),
                        chunk_event({}, "stop"),
                        b"data: [DONE]\n\n",
                    ]
                )
            )
        else:
            writer.write(whole("200 OK", answer_json(text)))
        return True
    if model == "bad-utf8":
        content = b"caf\xe9 \xff\xfe ok"
        if streamed:
            event = (
                b'data: {"choices":[{"index":0,"delta":{"content":"'
                + content
                + b'"},"finish_reason":null}]}\n\n'
            )
            writer.write(sse([event, chunk_event({}, "stop"), b"data: [DONE]\n\n"]))
        else:
            writer.write(
                whole(
                    "200 OK",
                    b'{"choices":[{"index":0,"message":{"role":"assistant","content":"'
                    + content
                    + b'"},"finish_reason":"stop"}]}',
                )
            )
        return True
    if model == "nul-error":
        writer.write(
            whole(
                "400 Bad Request",
                b"refused \x00 because \xff of reasons",
                content_type="text/plain",
            )
        )
        return True
    if model.startswith("tool-args-"):
        await tool_arguments(writer, int(model.rsplit("-", 1)[1]) << 20)
        return True
    if model.startswith("text-"):
        await long_text(writer, int(model.rsplit("-", 1)[1]) << 20, model)
        return True
    if model == "esc-error":
        error = {"message": "refused \x1b[31mred\x1b[0m\x07 and\rover", "code": "\x1b[2Jwiped"}
        writer.write(whole("400 Bad Request", json.dumps({"error": error}).encode()))
        return True
    if model == "status-999":
        writer.write(
            b"HTTP/1.1 999 Weird\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
        )
        return True
    if model == "redirect":
        writer.write(
            whole(
                "302 Found",
                b"",
                extra=[("location", "https://elsewhere.example/v1/chat/completions")],
            )
        )
        return True
    if model == "html-error":
        page = (
            b"<html><head><title>502 Bad Gateway</title></head>"
            b"<body><h1>Bad Gateway</h1></body></html>"
        )
        writer.write(whole("502 Bad Gateway", page, content_type="text/html"))
        return True
    if model == "two-responses":
        writer.write(
            whole("200 OK", answer_json("first"))
            + whole("200 OK", answer_json("second, never asked for"))
        )
        return True
    if model == "close-after-headers":
        writer.write(
            head(
                "200 OK", [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")]
            )
        )
        return False
    if model == "close-mid-chunk":
        first = chunk_event({"role": "assistant", "content": "Hel"})
        writer.write(
            head(
                "200 OK", [("content-type", "text/event-stream"), ("transfer-encoding", "chunked")]
            )
            + b"%x\r\n%s\r\n" % (len(first), first)
            + b"400\r\nda"
        )
        return False
    if model == "big-usage":
        usage = {"prompt_tokens": 2**70, "completion_tokens": 1e300, "total_tokens": -1}
        writer.write(
            whole(
                "200 OK",
                json.dumps(
                    {
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": "counted"},
                                "finish_reason": "x" * 500,
                            }
                        ],
                        "usage": usage,
                    }
                ).encode(),
            )
        )
        return True
    writer.write(
        whole(
            "404 Not Found", json.dumps({"error": {"message": f"no scenario {model!r}"}}).encode()
        )
    )
    return True


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    global connections
    connections += 1
    try:
        while True:
            try:
                request_head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            lines = request_head.decode("latin-1").split("\r\n")
            method, path = lines[0].split(" ")[:2]
            length = next(
                (
                    int(line.split(":", 1)[1])
                    for line in lines
                    if line.lower().startswith("content-length:")
                ),
                0,
            )
            body = await reader.readexactly(length) if length else b""
            if path.startswith("/_hostile/"):
                if method == "DELETE":
                    received.clear()
                    outages.clear()
                    floods.clear()
                    connections = 1
                    writer.write(whole("200 OK", b"{}"))
                else:
                    value: Any = (
                        received
                        if path.endswith("requests")
                        else floods
                        if path.endswith("floods")
                        else {"connections": connections}
                    )
                    writer.write(whole("200 OK", json.dumps(value).encode()))
                await writer.drain()
                continue
            request = json.loads(body or b"{}")
            model, streamed = str(request.get("model", "")), request.get("stream") is True
            received.append({"model": model, "stream": streamed})
            keep = await respond(model, streamed, writer)
            await writer.drain()
            if not keep:
                return
    except (ConnectionError, asyncio.IncompleteReadError):
        return
    finally:
        writer.close()


async def main(host: str, port: int) -> None:
    server = await asyncio.start_server(handle, host, port)
    bound = server.sockets[0].getsockname()
    print(f"hostile listening on http://{bound[0]}:{bound[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.host, args.port))
