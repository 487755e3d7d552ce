"""Reading a stream's lines and events (``agentops.outbound.line_batches``,
``calls.sse.SseParser``): lines end at CR, LF or CRLF however the bytes arrive, and one event
is bounded like one line (AGENTOPS_PROVIDER_MAX_EVENT_BYTES)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from agentops.outbound import ResponseRefused
from calls.sse import SseEvent, SseParser
from tests.calls.test_flood import flood_call


def fed(parser: SseParser, *lines: str) -> list[SseEvent]:
    return [event for line in lines if (event := parser.feed_line(line)) is not None]


def test_an_event_of_exactly_the_limit_is_read() -> None:
    # Each data line counts with its line end: 1,000 bytes + 23 + 2 ends = 1,025.
    parser = SseParser(1025)
    events = fed(parser, "data: " + "a" * 1000, "data: " + "b" * 23, "")
    assert events == [SseEvent("message", "a" * 1000 + "\n" + "b" * 23)]


def test_an_event_one_byte_past_the_limit_is_refused_naming_the_setting() -> None:
    parser = SseParser(1024)
    with pytest.raises(ResponseRefused) as refused:
        fed(parser, "data: " + "a" * 1000, "data: " + "b" * 23)
    assert refused.value.code == "event_too_large"
    assert "larger than 1024 bytes" in str(refused.value)
    assert "AGENTOPS_PROVIDER_MAX_EVENT_BYTES" in str(refused.value)


def test_an_events_size_is_counted_in_utf8_bytes() -> None:
    parser = SseParser(1024)
    with pytest.raises(ResponseRefused):
        fed(parser, "data: " + "é" * 512)  # 512 characters, 1,024 bytes and its line end


def test_the_limit_is_per_event_and_comments_do_not_count() -> None:
    parser = SseParser(1024)
    events = fed(
        parser,
        *(["data: " + "a" * 1000, ":" + " " * 2000, ""] * 50),
    )
    assert len(events) == 100 and events[-1] == SseEvent("message", "a" * 1000)


def test_empty_data_lines_without_a_blank_line_count_toward_the_limit() -> None:
    parser = SseParser(1024)
    with pytest.raises(ResponseRefused):
        fed(parser, *(["data:"] * 1025))


# --- lines over a real socket --------------------------------------------------------------

DELTA = json.dumps({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
# One event whose JSON is split over two data lines (joined by a newline, still JSON): read
# whole only if the line end between them is one line end, wherever the bytes were cut.
HEAD, TAIL = DELTA[: DELTA.index("[")], DELTA[DELTA.index("[") :]
STOP = json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})

CUTS = {
    "lf": [f"data: {HEAD}\ndata: {TAIL}\n\n".encode()],
    "crlf": [f"data: {HEAD}\r\ndata: {TAIL}\r\n\r\n".encode()],
    "cr": [f"data: {HEAD}\rdata: {TAIL}\r\r".encode()],
    "crlf-cut-between-cr-and-lf": [f"data: {HEAD}\r".encode(), f"\ndata: {TAIL}\r\n\r\n".encode()],
    "line-in-pieces": [b"da", f"ta: {HEAD}".encode(), f"\ndata: {TAIL}".encode(), b"\n", b"\n"],
}


async def served(parts: list[bytes]) -> AsyncIterator[str]:
    """A server on loopback answering each request with ``parts`` as separate writes, 30 ms
    apart (each read apart), then a stop."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        for part in [*parts, f"data: {STOP}\n\ndata: [DONE]\n\n".encode()]:
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.03)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


@pytest.mark.parametrize("cut", list(CUTS))
async def test_a_line_ends_at_cr_lf_or_crlf_however_the_bytes_arrive(cut: str) -> None:
    async for base in served(CUTS[cut]):
        result = await flood_call(base, "any")
    assert result.outcome == "completed" and result.output is not None, result
    assert result.output.text == "hi"
