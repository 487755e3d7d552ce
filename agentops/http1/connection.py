"""One connection: the protocol of its asyncio transport, and the parser of the answer it reads."""

from __future__ import annotations

import asyncio
import ipaddress
import select
from typing import Final

import httptools

from .errors import RemoteProtocolError, WriteError
from .response import Response

# An idle connection older than this is closed rather than used (servers drop idle ones).
KEEPALIVE_EXPIRY_S: Final = 5.0


class Connection(asyncio.Protocol):
    """One connection: the protocol of its transport, and the parser of the answer it reads."""

    __slots__ = ("closed", "drained", "idle_since", "loop", "lost", "parser", "raw", "read_paused", "response", "transport", "write_paused")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.raw: asyncio.BaseTransport | None = None  # the socket's own transport (under TLS's)
        self.parser: httptools.HttpResponseParser | None = None
        self.response: Response | None = None
        self.closed = self.lost = self.read_paused = self.write_paused = False
        self.drained: asyncio.Future[None] | None = None
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's are not asyncio.Transport's subclasses)
        # Under TLS, the socket's own transport is the one under asyncio's TLS protocol.
        self.raw = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None) or transport

    def data_received(self, data: bytes) -> None:
        response, parser = self.response, self.parser
        if response is None or parser is None:
            self.close()  # bytes nobody asked for: the connection cannot carry a request
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            response._fail(RemoteProtocolError("the server switched protocols"))
        except httptools.HttpParserError as exc:
            response._fail(RemoteProtocolError(f"the answer is not HTTP/1.1: {exc}"))

    def eof_received(self) -> bool:
        if self.response is not None:
            self.response._ended(None)
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.response is not None:
            self.response._ended(exc)
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)
        # asyncio's socket transport keeps a bound method of its own to read with (Python
        # 3.11-3.13), a cycle that outlives the connection until the cyclic collector finds it;
        # a worker freezes what survives a young collection (``agentops.collector``), so a
        # closed connection would stay until the next sweep. Closed, it reads no more.
        raw = self.raw
        if raw is not None and raw.is_closing() and getattr(raw, "_read_ready_cb", None) is not None:
            raw._read_ready_cb = None  # type: ignore[attr-defined]

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()
            self.read_paused = True

    def resume_reading(self) -> None:
        if self.read_paused and self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
            self.read_paused = False

    async def send(self, data: bytes, response: Response) -> None:
        transport = self.transport
        if self.lost or self.closed or transport is None or transport.is_closing():
            raise WriteError("the connection was closed")
        self.response = response
        self.parser = httptools.HttpResponseParser(response)
        transport.write(data)
        while self.write_paused and not self.lost:
            self.drained = self.loop.create_future()
            try:
                await self.drained
            finally:
                self.drained = None
        if self.lost and not response._started:
            raise WriteError("the connection was lost while the request was written")

    def usable(self, now: float) -> bool:
        """Whether this idle connection may carry another request: open, not idle too long,
        and nothing arrived on it meanwhile (the peer's close among it)."""
        transport = self.transport
        if self.lost or self.closed or transport is None or transport.is_closing() or now - self.idle_since > KEEPALIVE_EXPIRY_S:
            return False
        return not socket_readable(transport)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def socket_readable(transport: asyncio.BaseTransport) -> bool:
    """Whether the socket has something to read (what the loop has not read yet), or is gone."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.fileno() < 0:
        return True
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLIN)
    return bool(poll.poll(0))


def happy_eyeballs_delay(host: str) -> float | None:
    """Race a name's addresses 0.25 s apart; an address has nothing to race (a call is sent to
    the address its provider check resolved). asyncio's race leaves each connect's tasks,
    events and cancellations in reference cycles (Python 3.11): at 4,000 streams opening they
    were nearly all the collector found, and its young collections stopped the loop for 30-90
    ms each."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return 0.25
    return None
