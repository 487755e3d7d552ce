"""The client: a pool of idle connections per origin, and a request's exchange on one."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from .connection import Connection, happy_eyeballs_delay
from .errors import ConnectError, ConnectTimeout, ReadError, RemoteProtocolError, WriteError
from .request import Target, json_bytes, request_head
from .response import Response


class Client:
    """Connections to any number of origins, kept alive between requests: at most
    ``keep_idle`` idle ones per origin. One per event loop; use it on that loop only."""

    def __init__(self, *, tls: ssl.SSLContext | None = None, connect_timeout_s: float = 30.0, keep_idle: int = 32) -> None:
        self._tls = tls
        self.connect_timeout_s = connect_timeout_s
        self.keep_idle = keep_idle
        self._idle: dict[tuple[Any, ...], list[Connection]] = {}

    @asynccontextmanager
    async def stream(
        self, method: str, url: str, *, headers: Mapping[str, str] | None = None, json: Any = None,
        content: bytes | None = None, sni_hostname: str | None = None,
    ) -> AsyncIterator[Response]:
        """Send the request (``json`` encoded as JSON, or ``content`` as it is) and yield its
        answer once its status and headers arrived; the body is read from it inside the block.
        A connection whose answer was read whole goes back to the pool; any other is closed."""
        target = Target(url, sni_hostname)
        body = content if content is not None else json_bytes(json) if json is not None else b""
        request = request_head(method, target, headers or {}, len(body), json is not None) + body
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
                forget(conn, response)
                conn.close()
                conn, reused = await self._connect(target), False
                response = Response(conn)
            yield response
            done = response._complete and response._keep_alive and response._error is None
        finally:
            forget(conn, response)
            if done and not conn.lost:
                self._keep(target, conn)
            else:
                conn.close()

    async def _connection(self, target: Target) -> tuple[Connection, bool]:
        idle = self._idle.get(target.key)
        if idle:
            now = asyncio.get_running_loop().time()
            while idle:
                conn = idle.pop()
                if conn.usable(now):
                    return conn, True
                conn.close()
        return await self._connect(target), False

    async def _connect(self, target: Target) -> Connection:
        loop = asyncio.get_running_loop()
        tls = None
        if target.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()  # the trust store: loaded once
            tls = self._tls
        conn = Connection(loop)
        # (uvloop's loop, the web app's under uvicorn, takes no race delay and races no names.)
        delay = happy_eyeballs_delay(target.host) if isinstance(loop, asyncio.BaseEventLoop) else None
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

    def _keep(self, target: Target, conn: Connection) -> None:
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


def forget(conn: Connection, response: Response) -> None:
    """Unbind the answer from its connection and parser (the parser holds the answer's
    callbacks: a cycle the collector would have to find)."""
    conn.response = conn.parser = None
    response._conn = None
