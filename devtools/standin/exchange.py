"""One HTTP request/response of the stand-in on the ASGI wire.

:class:`Exchange` wraps an ASGI ``receive``/``send`` pair: it sends response
headers, body messages and paced SSE frames, and watches for
``http.disconnect`` so that every wait of a scenario ends promptly when the
client goes away (or the server shuts down).  It knows nothing of scenarios or
wire formats: the app (:mod:`devtools.standin.app`) opens one per provider
request and :mod:`devtools.standin.playback` sends the scenario through it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from devtools.standin.wire import Headers, dumps

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Exchange:
    """One HTTP request/response on the wire.

    Watches ``receive()`` for ``http.disconnect`` so that every wait ends
    promptly when the client goes away (or the server shuts down).
    """

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self.gone = asyncio.Event()
        self.disconnected = False
        self.started = False
        self.complete = False
        #: Pause between consecutive frames sent with :meth:`emit`.
        self.interval = 0.0
        self._frames_sent = 0
        self._watcher: asyncio.Task[None] | None = None

    def watch(self) -> None:
        self._watcher = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        try:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    break
        except Exception:
            pass
        self.disconnected = True
        self.gone.set()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher

    async def sleep(self, seconds: float) -> bool:
        """Sleep; False (early) if the client is gone."""
        if self.gone.is_set():
            return False
        if seconds <= 0:
            await asyncio.sleep(0)
            return not self.gone.is_set()
        try:
            await asyncio.wait_for(self.gone.wait(), timeout=seconds)
        except TimeoutError:
            return True
        return False

    async def wait_gone(self) -> None:
        await self.gone.wait()

    async def _raw(self, message: Message) -> bool:
        if self.disconnected:
            return False
        try:
            await self._send(message)
        except Exception:  # the transport died under us
            self.disconnected = True
            self.gone.set()
            return False
        return True

    async def start(self, status: int, headers: Headers) -> bool:
        if self.gone.is_set() or self.started:
            return False
        message = {"type": "http.response.start", "status": status, "headers": headers}
        self.started = await self._raw(message)
        return self.started

    async def body(self, data: bytes, *, more: bool = True) -> bool:
        if self.gone.is_set() or self.complete:
            return False
        if not await self._raw({"type": "http.response.body", "body": data, "more_body": more}):
            return False
        self.complete = not more
        return True

    async def emit(self, frames: Iterable[bytes]) -> bool:
        """Send each frame as its own body message, ``interval`` apart."""
        for frame in frames:
            if self._frames_sent and not await self.sleep(self.interval):
                return False
            if not await self.body(frame):
                return False
            self._frames_sent += 1
        return True

    async def end(self) -> None:
        await self.body(b"", more=False)

    async def respond_json(
        self, status: int, obj: Any, headers: Iterable[tuple[bytes, bytes]] = ()
    ) -> None:
        data = dumps(obj)
        all_headers: Headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
            *headers,
        ]
        if await self.start(status, all_headers):
            await self.body(data, more=False)

    async def finalize(self, status: int, obj: Any) -> None:
        """Leave the HTTP exchange well-formed whatever the scenario did."""
        if self.disconnected:
            return
        if not self.started:
            data = dumps(obj)
            headers: Headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ]
            if await self._raw(
                {"type": "http.response.start", "status": status, "headers": headers}
            ):
                await self._raw({"type": "http.response.body", "body": data, "more_body": False})
        elif not self.complete:
            await self._raw({"type": "http.response.body", "body": b"", "more_body": False})
        self.started = self.complete = True
