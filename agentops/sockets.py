"""The sockets under the background loop's HTTP clients: httpcore's network backend written on
asyncio's own transports, instead of the anyio streams httpcore uses by default.

A worker holds thousands of streams that mostly wait. Through anyio each of them kept a socket
stream with its two guards, a protocol with two events and a read queue, and each read entered
a cancel scope and two context managers even when no timeout was asked for, on the loop that
times the cuts. Here a stream is one protocol object: a read returns what the transport
delivered or waits on one future. (With the agent runs started without a thread-side future,
this took a held stream's RSS from 66.6 to 56.6 KB in the bounds bench at 2,000 streams.)

``asyncio_transport`` builds an httpx transport on it.
"""

from __future__ import annotations

import asyncio
import ipaddress
import select
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx

# Past this many unread bytes the socket is not read until the reader catches up.
READ_HIGH_WATER = 256 * 1024


class AsyncioStream(asyncio.Protocol, httpcore.AsyncNetworkStream):
    """One connection: the asyncio protocol of its transport, and httpcore's stream on it."""

    __slots__ = ("_buffer", "_closed", "_drained", "_eof", "_error", "_loop", "_paused", "_raw", "_read_paused", "_transport", "_waiter")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._raw: asyncio.Transport | None = None  # the socket's own transport (under TLS's)
        self._buffer = b""
        self._eof = False  # the peer sent its end, or the connection was lost
        self._error: BaseException | None = None
        self._closed = False  # closed on this side
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False  # the transport's write buffer is full
        self._read_paused = False  # the socket is not read until the buffer drains
        self._drained: asyncio.Future[None] | None = None

    # --- asyncio's side ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = self._raw = transport

    def data_received(self, data: bytes) -> None:
        self._buffer = self._buffer + data if self._buffer else data
        if len(self._buffer) > READ_HIGH_WATER and self._transport is not None and not self._read_paused:
            self._transport.pause_reading()
            self._read_paused = True
        self._wake()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # let the transport close

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._error = exc
        self._wake()
        self.resume_writing()
        # asyncio's socket transport keeps a bound method of its own to read with (Python
        # 3.11-3.13), a cycle that outlives the connection until the cyclic collector finds it;
        # a worker freezes what survives a young collection (``agentops.collector``), so a
        # closed connection would stay until the next sweep. Closed, it reads no more.
        if self._raw is not None and self._raw.is_closing() and getattr(self._raw, "_read_ready_cb", None) is not None:
            self._raw._read_ready_cb = None  # type: ignore[attr-defined]

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # --- httpcore's side --------------------------------------------------------------------

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        while not self._buffer:
            if self._closed:
                raise httpcore.ReadError("the connection was closed")
            if self._error is not None:
                raise httpcore.ReadError(str(self._error) or type(self._error).__name__)
            if self._eof:
                return b""
            self._waiter = self._loop.create_future()
            try:
                await _within(self._waiter, timeout, httpcore.ReadTimeout)
            finally:
                self._waiter = None
        if len(self._buffer) <= max_bytes:
            data, self._buffer = self._buffer, b""
        else:
            data, self._buffer = self._buffer[:max_bytes], self._buffer[max_bytes:]
        if self._read_paused and len(self._buffer) <= READ_HIGH_WATER and self._transport is not None:
            self._transport.resume_reading()
            self._read_paused = False
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        transport = self._transport
        if self._closed or self._eof or transport is None or transport.is_closing():
            raise httpcore.WriteError("the connection was closed")
        transport.write(buffer)
        if self._paused:
            self._drained = self._loop.create_future()
            try:
                await _within(self._drained, timeout, httpcore.WriteTimeout)
            finally:
                self._drained = None
            if self._error is not None:
                raise httpcore.WriteError(str(self._error) or type(self._error).__name__)

    async def aclose(self) -> None:
        self._closed = True
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        assert self._transport is not None
        try:
            tls = await _within(
                self._loop.start_tls(self._transport, self, ssl_context, server_hostname=server_hostname),
                timeout, httpcore.ConnectTimeout,
            )
        except OSError as exc:  # ssl.SSLError among them
            await self.aclose()
            raise httpcore.ConnectError(str(exc)) from exc
        except BaseException:
            await self.aclose()
            raise
        self._transport = tls
        return self

    def get_extra_info(self, info: str) -> Any:
        transport = self._transport
        if transport is None:
            return None
        if info == "ssl_object":
            return transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return transport.get_extra_info("sockname")
        if info == "server_addr":
            return transport.get_extra_info("peername")
        if info == "socket":
            return transport.get_extra_info("socket")
        if info == "is_readable":
            # Asked of an idle connection: anything arrived (the peer's close among it) means it
            # cannot carry another request. What the loop has not read yet is in the socket.
            return bool(self._buffer) or self._eof or _socket_readable(transport)
        return None


def _happy_eyeballs_delay(host: str) -> float | None:
    """Race a name's addresses as anyio's connect does (0.25 s apart); an address has nothing to
    race (a call is sent to the address its provider check resolved). asyncio's race leaves
    each connect's tasks, events and cancellations in reference cycles (Python 3.11): at
    4,000 streams opening, they were nearly all the collector found, and its young
    collections came every second and stopped the loop for 30-90 ms each."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return 0.25
    return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            _, stream = await _within(
                loop.create_connection(
                    lambda: AsyncioStream(loop), host, port,
                    local_addr=(local_address, 0) if local_address else None,
                    happy_eyeballs_delay=_happy_eyeballs_delay(host),
                ),
                timeout, httpcore.ConnectTimeout,
            )
        except OSError as exc:
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        sock = stream.get_extra_info("socket")
        for option in socket_options or ():
            sock.setsockopt(*option)
        return stream

    async def connect_unix_socket(self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not used here")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


async def _within(awaitable: Any, timeout: float | None, timed_out: type[Exception]) -> Any:
    if timeout is None:
        return await awaitable
    try:
        async with asyncio.timeout(timeout):
            return await awaitable
    except TimeoutError as exc:
        raise timed_out(f"no answer within {timeout:g} s") from exc


def _socket_readable(transport: asyncio.BaseTransport) -> bool:
    sock = transport.get_extra_info("socket")
    if sock is None or sock.fileno() < 0:
        return True
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLIN)
    return bool(poll.poll(0))


def asyncio_transport(*, verify: ssl.SSLContext, limits: httpx.Limits) -> httpx.AsyncHTTPTransport:
    """An httpx transport (HTTP/1.1, TLS with ``verify``) whose connections are ``AsyncioStream``s.
    httpx takes no network backend, so its pool is replaced by one built the same way with
    this backend (``tests/agentops/test_sockets.py`` checks the replacement still takes)."""
    transport = httpx.AsyncHTTPTransport(verify=verify, limits=limits)
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=verify,
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=AsyncioBackend(),
    )
    return transport
