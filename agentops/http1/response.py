"""Reading an answer: its status and headers, then its body as chunks, lines or a whole, fed by
httptools' parser callbacks on the loop."""

from __future__ import annotations

import asyncio
import codecs
import zlib
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Final, Protocol

from .errors import HttpError, ReadError, RemoteProtocolError

# Past this many unread bytes of an answer the socket is not read until the reader catches up.
READ_HIGH_WATER: Final = 256 * 1024


class Carrier(Protocol):
    """What an answer needs of the connection it arrives on (``connection.Connection``)."""

    loop: asyncio.AbstractEventLoop
    parser: Any  # httptools' parser of this answer

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def close(self) -> None: ...


class Response:
    """One answer as it arrives: its status and headers (names in lower case, repeated ones
    joined with ", "), then its body, read once with ``aiter_bytes``, ``aiter_lines`` or
    ``aread``. The parser's callbacks feed it on the loop."""

    __slots__ = (
        "_buffered", "_chunks", "_complete", "_conn", "_decoder", "_error", "_headed", "_keep_alive",
        "_started", "_until_close", "_waiter", "headers", "status_code",
    )

    def __init__(self, conn: Carrier) -> None:
        self._conn: Carrier | None = conn
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
