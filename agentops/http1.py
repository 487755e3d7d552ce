"""The HTTP/1.1 client of provider calls: a request written on one of asyncio's own transports,
its answer parsed by httptools (llhttp, in C).

A worker starts calls by the hundred a second and holds thousands of streams that mostly wait,
on the one loop that also times their cuts. Through httpx and httpcore a short non-streamed call
cost 1.1-1.2 ms of CPU here and a three-delta stream 3.3-4 ms, against 0.1 and 1.0 ms for the
same exchanges written on an asyncio protocol with httptools' parser (a micro-benchmark against
the stand-in, one process, one connection): the request and response models, the header
normalisation, the auth and redirect steps, h11's state machine per event and the pool's walk
over its connections at every request and close. Here a connection is one protocol object, an
answer one object fed by the parser's callbacks, and a pool a list of idle connections per
origin.

What it does: POST (or any method) with a body, ``Content-Length`` or chunked answers or an
answer read to the connection's end, keep-alive reuse (an idle connection the peer closed or
wrote to, or idle past ``KEEPALIVE_EXPIRY_S``, is not used again; a request that a reused
connection lost before any answer is sent once more on a new one), TLS verified against the
server name (``sni_hostname`` when the URL is the address the provider policy checked), a
connect timeout, gzip and deflate answers decoded (it asks for none), backpressure both ways.
What it does not: proxies (a call goes to the address its provider check resolved, as a
webhook does), redirects (a provider's answer is read as it is), HTTP/2, a read timeout (the
progress bounds decide how long a call may take).

Its errors are named as httpx names the same failures (``ConnectError``, ``ReadError``,
``RemoteProtocolError``...): a call's error message starts with that name
(``inference.calls.classify.classify_exception``).
"""

from __future__ import annotations

import asyncio
import codecs
import ipaddress
import json as _json
import re
import select
import ssl
import zlib
from collections import deque
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final
from urllib.parse import urlsplit

import httptools

# Past this many unread bytes of an answer the socket is not read until the reader catches up.
READ_HIGH_WATER: Final = 256 * 1024
# An idle connection older than this is closed rather than used (servers drop idle ones).
KEEPALIVE_EXPIRY_S: Final = 5.0
USER_AGENT: Final = "agentops"
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\r\n\x00]")


class HttpError(Exception):
    """A failure below HTTP's answer: no answer, or not a whole one."""


class ConnectError(HttpError):
    """The connection (or its TLS handshake) failed: the request was not sent."""


class ConnectTimeout(HttpError):
    """No connection within the connect timeout: the request was not sent."""


class WriteError(HttpError):
    """The connection was lost while the request was written."""


class ReadError(HttpError):
    """The connection was lost (reset) while the answer was read."""


class RemoteProtocolError(HttpError):
    """The peer broke HTTP/1.1: an answer that does not parse, or one cut short by its close."""


class LocalProtocolError(HttpError):
    """The request cannot be written as HTTP/1.1 (a header name or value that would break it)."""


class _Target:
    """Where a request goes: the origin (the pool's key), the address to connect to, the
    request target and the Host header."""

    __slots__ = ("authority", "host", "key", "path", "port", "server_hostname", "tls")

    def __init__(self, url: str, sni_hostname: str | None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LocalProtocolError(f"not an http(s) URL: {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.authority = parts.netloc.rpartition("@")[2]
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.server_hostname = (sni_hostname or self.host) if self.tls else None
        self.key = (self.tls, self.host, self.port, self.server_hostname)


def _head(method: str, target: _Target, headers: Mapping[str, str], length: int, json_body: bool) -> bytes:
    """The request line and headers. A name that is not a token, or a value with a line break
    or a NUL, is refused (it would let a header end the request early, or inject one)."""
    lines = [f"{method} {target.path} HTTP/1.1"]
    given = {name.lower() for name in headers}
    if "host" not in given:
        lines.append(f"host: {target.authority}")
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            raise LocalProtocolError(f"the request header {name!r} cannot be sent as HTTP/1.1")
        if name.lower() in ("content-length", "transfer-encoding", "connection"):
            continue  # this client frames the body and keeps the connection
        lines.append(f"{name}: {value}")
    if "user-agent" not in given:
        lines.append(f"user-agent: {USER_AGENT}")
    if "accept-encoding" not in given:
        lines.append("accept-encoding: identity")
    if json_body and "content-type" not in given:
        lines.append("content-type: application/json")
    lines.append(f"content-length: {length}")
    try:
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(f"a request header is not latin-1 text: {exc}") from None


class Response:
    """One answer as it arrives: its status and headers (names in lower case, repeated ones
    joined with ", "), then its body, read once with ``aiter_bytes``, ``aiter_lines`` or
    ``aread``. The parser's callbacks feed it on the loop."""

    __slots__ = (
        "_buffered", "_chunks", "_complete", "_conn", "_decoder", "_error", "_headed", "_keep_alive",
        "_started", "_until_close", "_waiter", "headers", "status_code",
    )

    def __init__(self, conn: _Connection) -> None:
        self._conn: _Connection | None = conn
        self.status_code = 0
        self.headers: dict[str, str] = {}
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._headed = self._complete = self._keep_alive = self._until_close = False
        self._started = False  # any byte of the answer arrived
        self._error: HttpError | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._decoder: Any = None  # a zlib decompressor for a gzip or deflate body

    # --- httptools' callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._started = True

    def on_header(self, name: bytes, value: bytes) -> None:
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        conn = self._conn
        assert conn is not None and conn.parser is not None
        status = conn.parser.get_status_code()
        if status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            self.headers = {}
            return
        self.status_code = status
        self._headed = True
        headers = self.headers
        self._until_close = (
            "content-length" not in headers and "chunked" not in headers.get("transfer-encoding", "").lower()
            and self.status_code not in (204, 304) and self.status_code >= 200
        )
        coding = headers.get("content-encoding", "identity").strip().lower()
        if coding in ("gzip", "x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif coding == "deflate":
            self._decoder = zlib.decompressobj()
        elif coding not in ("identity", ""):
            self._fail(RemoteProtocolError(f"the answer's content-encoding {coding!r} is not one this client asked for or reads"))
        self._wake()

    def on_body(self, body: bytes) -> None:
        if self._decoder is not None:
            try:
                body = self._decoder.decompress(body)
            except zlib.error as exc:
                self._fail(RemoteProtocolError(f"the answer's compressed body does not decode: {exc}"))
                return
        if body:
            self._chunks.append(body)
            self._buffered += len(body)
            if self._buffered > READ_HIGH_WATER and self._conn is not None:
                self._conn.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if not self._headed:
            return  # an interim answer's end
        conn = self._conn
        self._keep_alive = conn is not None and conn.parser is not None and conn.parser.should_keep_alive()
        self._complete = True
        self._wake()

    # --- the connection's side --------------------------------------------------------------

    def _ended(self, exc: Exception | None) -> None:
        """The peer closed (``exc`` None) or the connection was lost."""
        if self._complete:
            return
        if exc is None and self._headed and self._until_close:
            self._complete = True  # an answer read to the connection's end
        elif exc is not None:
            self._fail(ReadError(str(exc) or type(exc).__name__))
        else:
            what = "before its answer's end" if self._started else "without an answer"
            self._fail(RemoteProtocolError(f"the server closed the connection {what}"))
        self._wake()

    def _fail(self, error: HttpError) -> None:
        if self._error is None:
            self._error = error
        if self._conn is not None:
            self._conn.close()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        conn = self._conn
        if conn is None:
            raise ReadError("the answer's connection was closed")
        self._waiter = conn.loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    async def _headers(self) -> None:
        while not self._headed:
            if self._error is not None:
                raise self._error
            await self._wait()

    # --- the reader's side ------------------------------------------------------------------

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        """The body's chunks as they arrive (decoded when compressed), until its end. Raises
        ``RemoteProtocolError`` or ``ReadError`` when the connection ends before it."""
        while True:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                if self._conn is not None and self._buffered <= READ_HIGH_WATER:
                    self._conn.resume_reading()
                yield chunk
            elif self._error is not None:
                raise self._error
            elif self._complete:
                if self._decoder is not None and (rest := self._decoder.flush()):
                    self._decoder = None
                    yield rest
                return
            else:
                await self._wait()

    async def aiter_lines(self) -> AsyncIterator[str]:
        """The body as lines of UTF-8 text (an invalid byte becomes U+FFFD), split at CR, LF and
        CRLF as server-sent events are, without their line ends."""
        text = ""
        decoder = _utf8()
        async for chunk in self.aiter_bytes():
            text += decoder.decode(chunk)
            start = 0
            while True:
                cr, lf = text.find("\r", start), text.find("\n", start)
                if cr == -1 and lf == -1:
                    break
                if lf != -1 and (cr == -1 or lf < cr):
                    yield text[start:lf]
                    start = lf + 1
                elif cr + 1 < len(text):
                    yield text[start:cr]
                    start = cr + 2 if text[cr + 1] == "\n" else cr + 1
                else:
                    break  # a CR at the end: a LF may follow in the next chunk
            text = text[start:]
        text += decoder.decode(b"", final=True)
        if text.endswith("\r"):
            text = text[:-1]
            yield text
        elif text:
            yield text

    async def aread(self) -> bytes:
        """The whole body."""
        return b"".join([chunk async for chunk in self.aiter_bytes()])


def _utf8() -> codecs.IncrementalDecoder:
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


class _Connection(asyncio.Protocol):
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
        return not _socket_readable(transport)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def _socket_readable(transport: asyncio.BaseTransport) -> bool:
    """Whether the socket has something to read (what the loop has not read yet), or is gone."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.fileno() < 0:
        return True
    poll = select.poll()
    poll.register(sock.fileno(), select.POLLIN)
    return bool(poll.poll(0))


def _happy_eyeballs_delay(host: str) -> float | None:
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


class Client:
    """Connections to any number of origins, kept alive between requests: at most
    ``keep_idle`` idle ones per origin. One per event loop; use it on that loop only."""

    def __init__(self, *, tls: ssl.SSLContext | None = None, connect_timeout_s: float = 30.0, keep_idle: int = 32) -> None:
        self._tls = tls
        self.connect_timeout_s = connect_timeout_s
        self.keep_idle = keep_idle
        self._idle: dict[tuple[Any, ...], list[_Connection]] = {}

    @asynccontextmanager
    async def stream(
        self, method: str, url: str, *, headers: Mapping[str, str] | None = None, json: Any = None,
        content: bytes | None = None, sni_hostname: str | None = None,
    ) -> AsyncIterator[Response]:
        """Send the request (``json`` encoded as JSON, or ``content`` as it is) and yield its
        answer once its status and headers arrived; the body is read from it inside the block.
        A connection whose answer was read whole goes back to the pool; any other is closed."""
        target = _Target(url, sni_hostname)
        body = content if content is not None else _json_bytes(json) if json is not None else b""
        request = _head(method, target, headers or {}, len(body), json is not None) + body
        conn, reused = await self._connection(target)
        response = Response(conn)
        done = False
        try:
            while True:
                try:
                    await conn.send(request, response)
                    await response._headers()
                    break
                except (WriteError, ReadError, RemoteProtocolError):
                    if not reused or response._started:
                        raise
                # A kept connection the server closed as the request went out: it never read it
                # (no answer began), so the request goes once more, on a new connection.
                _forget(conn, response)
                conn.close()
                conn, reused = await self._connect(target), False
                response = Response(conn)
            yield response
            done = response._complete and response._keep_alive and response._error is None
        finally:
            _forget(conn, response)
            if done and not conn.lost:
                self._keep(target, conn)
            else:
                conn.close()

    async def _connection(self, target: _Target) -> tuple[_Connection, bool]:
        idle = self._idle.get(target.key)
        if idle:
            now = asyncio.get_running_loop().time()
            while idle:
                conn = idle.pop()
                if conn.usable(now):
                    return conn, True
                conn.close()
        return await self._connect(target), False

    async def _connect(self, target: _Target) -> _Connection:
        loop = asyncio.get_running_loop()
        tls = None
        if target.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()  # the trust store: loaded once
            tls = self._tls
        conn = _Connection(loop)
        # (uvloop's loop, the web app's under uvicorn, takes no race delay and races no names.)
        delay = _happy_eyeballs_delay(target.host) if isinstance(loop, asyncio.BaseEventLoop) else None
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                if delay is None:
                    await loop.create_connection(lambda: conn, target.host, target.port, ssl=tls, server_hostname=target.server_hostname)
                else:
                    await loop.create_connection(
                        lambda: conn, target.host, target.port, ssl=tls, server_hostname=target.server_hostname, happy_eyeballs_delay=delay,
                    )
        except TimeoutError:
            conn.close()
            raise ConnectTimeout(f"no connection to {target.authority} within {self.connect_timeout_s:g} s") from None
        except OSError as exc:  # ssl.SSLError (a certificate refused) among them
            conn.close()
            raise ConnectError(str(exc) or type(exc).__name__) from None
        return conn

    def _keep(self, target: _Target, conn: _Connection) -> None:
        idle = self._idle.setdefault(target.key, [])
        if len(idle) >= self.keep_idle:
            conn.close()
            return
        conn.idle_since = asyncio.get_running_loop().time()
        idle.append(conn)

    async def aclose(self) -> None:
        """Close every idle connection (those in use close as their requests end)."""
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _forget(conn: _Connection, response: Response) -> None:
    """Unbind the answer from its connection and parser (the parser holds the answer's
    callbacks: a cycle the collector would have to find)."""
    conn.response = conn.parser = None
    response._conn = None


def _json_bytes(value: Any) -> bytes:
    # As httpx encodes a ``json=`` body.
    return _json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
