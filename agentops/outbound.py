"""Outbound HTTP (provider calls, webhook deliveries) on aiohttp (architecture.md §15): one session
per event loop, connecting only to addresses a policy checked, every answer bounded.

- Addresses: the session's resolver answers a host name only with the addresses its policy
  check resolved just before the request (``pin``); a name nobody checked does not resolve,
  and the name is never looked up again by the client (a name that answered the check with a
  public address cannot answer the connection with a private one). TLS is verified against
  the URL's host name as usual.
- Bounds: aiohttp's own on the header section (``max_headers``, ``max_field_size``,
  ``max_line_size``); ours on what is read of a body (``read_capped``) and on each line of a
  stream (``line_batches``), both after decoding: aiohttp decompresses in bounded steps, so a
  small compressed answer cannot inflate past them.
- Proxies: ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` for provider calls
  (``AGENTOPS_PROVIDER_PROXY_FROM_ENV``), read once per session; a proxy's own host resolves
  normally (it was configured, not sent to us). Webhook deliveries never use a proxy.
- No total timeout: a call lives as long as its progress bounds allow; only the connect is
  timed. No connection limit: a worker holds thousands of streams.
- No cookies kept, no redirects followed.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextvars import ContextVar
from typing import Any, Final
from urllib.request import proxy_bypass

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_proto import ResponseHandler
from aiohttp.helpers import ProxyInfo, proxies_from_env
from aiohttp.resolver import DefaultResolver
from django.conf import settings
from yarl import URL

from .urlsafety import IPAddress

USER_AGENT: Final = "agentops"
# An idle kept connection is closed after this long: under the 5 s idle timeout of common
# servers, so a request is not sent on a connection the server is closing (a POST is never
# sent twice by the client).
KEEPALIVE_S: Final = 4.0


class ResponseRefused(Exception):
    """An answer (or part of one) past a limit: it was not read further. ``code`` names the
    limit for the call's error (``response_too_large``, ``line_too_long``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class CheckedResolver(AbstractResolver):
    """Answers a host name with the addresses its policy check last resolved (``pin``), and
    the configured proxies' hosts by a plain lookup; any other name is refused."""

    def __init__(self, proxy_hosts: frozenset[str]) -> None:
        self._pinned: dict[str, tuple[IPAddress, ...]] = {}
        self._proxy_hosts = proxy_hosts
        self._plain: AbstractResolver | None = None

    def pin(self, host: str, addresses: Sequence[IPAddress]) -> None:
        self._pinned[host.lower().rstrip(".")] = tuple(addresses)

    async def resolve(  # type: ignore[override]
        self, host: str, port: int = 0, family: int = 0
    ) -> list[ResolveResult]:
        name = host.lower().rstrip(".")
        addresses = self._pinned.get(name)
        if addresses:
            return [
                {
                    "hostname": host,
                    "host": str(a),
                    "port": port,
                    "family": socket.AF_INET6 if a.version == 6 else socket.AF_INET,
                    "proto": 0,
                    "flags": 0,
                }
                for a in addresses
            ]
        if name in self._proxy_hosts:
            if self._plain is None:
                self._plain = DefaultResolver()
            return await self._plain.resolve(host, port, family)  # type: ignore[arg-type]
        raise OSError(f"{host} was not checked by the address policy, so it is not connected to")

    async def close(self) -> None:
        if self._plain is not None:
            await self._plain.close()


# Called on the loop when the first byte of the answer to a request arrives: set around
# ``Outbound.request`` by its caller. The request's own task hands it to the connection (a
# context variable: aiohttp sets a connection's response parameters in that task), so a header
# section that begins but never ends can be timed (aiohttp shows nothing before its end).
first_byte_hook: ContextVar[Callable[[], None] | None] = ContextVar("first_byte_hook", default=None)


class _FirstByteWatched(ResponseHandler):
    """aiohttp's connection protocol, telling ``first_byte_hook`` of its answer's first byte."""

    _first_byte: Callable[[], None] | None = None

    def set_response_params(self, **params: Any) -> None:
        self._first_byte = first_byte_hook.get()
        super().set_response_params(**params)

    def data_received(self, data: bytes) -> None:
        hook = self._first_byte
        if hook is not None and data:
            self._first_byte = None
            hook()
        super().data_received(data)


class Outbound:
    """A loop's session, its resolver and the proxies read from the environment."""

    closer: AsyncGenerator[None, None]  # closes the session (``outbound``)

    def __init__(self) -> None:
        self.proxies: dict[str, ProxyInfo] = (
            proxies_from_env() if settings.AGENTOPS_PROVIDER_PROXY_FROM_ENV else {}
        )
        proxy_hosts = frozenset(p.proxy.host.lower() for p in self.proxies.values() if p.proxy.host)
        self.resolver = CheckedResolver(proxy_hosts)
        connect_s = settings.AGENTOPS_PROVIDER_CONNECT_TIMEOUT_MS / 1000
        connector = aiohttp.TCPConnector(
            limit=0, use_dns_cache=False, resolver=self.resolver, keepalive_timeout=KEEPALIVE_S
        )
        connector._factory = functools.partial(  # type: ignore[assignment]
            _FirstByteWatched, loop=connector._loop
        )
        self.session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=connect_s, sock_connect=connect_s),
            headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"},
            cookie_jar=aiohttp.DummyCookieJar(),
            max_headers=settings.AGENTOPS_PROVIDER_MAX_HEADERS,
            max_field_size=settings.AGENTOPS_PROVIDER_MAX_HEADER_BYTES,
            max_line_size=settings.AGENTOPS_PROVIDER_MAX_HEADER_BYTES,
        )

    def proxy_for(self, url: URL) -> ProxyInfo | None:
        """The proxy a provider request to ``url`` goes through, if any (``NO_PROXY`` honoured)."""
        if not self.proxies or url.host is None or proxy_bypass(url.host):
            return None
        return self.proxies.get(url.scheme)

    def request(
        self,
        url: str,
        *,
        body: bytes,
        headers: dict[str, str],
        addresses: Sequence[IPAddress] | None,
        proxied: bool,
        ssl: Any = True,
    ) -> Any:
        """POST ``body`` to ``url``: a context manager yielding the aiohttp response. The host
        connects to ``addresses`` (what its check resolved; None for an address in the URL);
        ``proxied``: through the environment's proxy for it, if there is one."""
        target = URL(url)
        if addresses and target.host is not None:
            self.resolver.pin(target.host, addresses)
        proxy = self.proxy_for(target) if proxied else None
        return self.session.post(
            target,
            data=body,
            headers=headers,
            allow_redirects=False,
            ssl=ssl,
            proxy=proxy.proxy if proxy else None,
            proxy_auth=proxy.proxy_auth if proxy else None,
        )


def proxy_configured(url: str) -> bool:
    """Whether a provider request to ``url`` would go through a proxy of the environment (read
    now, as a new session would read it)."""
    if not settings.AGENTOPS_PROVIDER_PROXY_FROM_ENV:
        return False
    target = URL(url)
    return (
        target.host is not None
        and target.scheme in proxies_from_env()
        and not proxy_bypass(target.host)
    )


_per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Outbound] = (
    weakref.WeakKeyDictionary()
)


def outbound() -> Outbound:
    """The running loop's session (one per loop: its connections are bound to it), closed when
    ``outbound_close`` is awaited or, failing that, when the loop shuts down."""
    loop = asyncio.get_running_loop()
    made = _per_loop.get(loop)
    if made is None or made.session.closed:
        made = _per_loop[loop] = Outbound()
        made.closer = _closed_at_loop_end(made)
        # Started at once: the loop keeps an async generator begun on it and closes it when it
        # shuts down (asyncio.run, a Runner, uvicorn), so a session on a loop nobody closes it
        # on (Django's test Client runs each async view on a loop asyncio.run ends) is closed
        # there, not left to warn "Unclosed client session" when collected at exit.
        try:
            made.closer.asend(None).send(None)
        except StopIteration:
            pass
    return made


async def _closed_at_loop_end(made: Outbound) -> AsyncGenerator[None, None]:
    try:
        yield
    finally:
        await made.session.close()


async def outbound_close() -> None:
    """Close the running loop's session and its kept connections (a loop that ends)."""
    made = _per_loop.pop(asyncio.get_running_loop(), None)
    if made is not None:
        await made.closer.aclose()


async def read_capped(
    response: aiohttp.ClientResponse, limit: int, *, what: str, setting: str | None
) -> bytes:
    """The body, decoded, up to ``limit`` bytes. Past it: with ``setting``, ResponseRefused
    naming it; without, what was read so far (an error body: only a bounded part is kept)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            if setting is None:
                chunks.append(chunk[: limit - (size - len(chunk))])
                break
            raise ResponseRefused(
                "response_too_large",
                f"{what} was larger than {limit} bytes, so it was not read further "
                f"(the limit: {setting})",
            )
        chunks.append(chunk)
    return b"".join(chunks)


async def line_batches(
    response: aiohttp.ClientResponse, *, line_limit: int, total_limit: int, most: int
) -> AsyncIterator[list[str]]:
    """The body as lines of UTF-8 text (an invalid byte becomes U+FFFD), split at CR, LF and
    CRLF as server-sent events are, without their line ends, in lists of at most ``most``: a
    list ends where a read's bytes are used up (the next may wait for bytes) or at ``most``
    lines (a large read is split no further than its reader has got). A line longer than
    ``line_limit`` bytes, or more than ``total_limit`` bytes in all, raises ResponseRefused.
    Each byte is scanned once however a line arrives."""
    buffer = bytearray()
    scanned = total = 0
    cr_pending = False  # the last line ended with CR: a LF that comes first belongs to it
    async for chunk in response.content.iter_any():
        total += len(chunk)
        if total > total_limit:
            raise ResponseRefused(
                "response_too_large",
                f"the stream sent more than {total_limit} bytes, so it was not read further "
                "(the limit: AGENTOPS_PROVIDER_MAX_STREAM_BYTES)",
            )
        buffer += chunk
        batch: list[str] = []
        start = 0
        if cr_pending and buffer[:1] == b"\n":
            start = 1
        cr_pending = False
        scanned = max(scanned, start)
        # Where the next CR and the next LF are, at or past ``scanned`` (-1: none in the
        # buffer, -2: not looked for): each is looked for again only once passed, so a chunk
        # of many lines is not searched to its end for a CR at every line.
        cr = lf = -2
        while True:
            if cr != -1 and cr < scanned:
                cr = buffer.find(b"\r", scanned)
            if lf != -1 and lf < scanned:
                lf = buffer.find(b"\n", scanned)
            end = lf if cr == -1 or (lf != -1 and lf < cr) else cr
            if end == -1:
                scanned = len(buffer)
                break
            batch.append(buffer[start:end].decode("utf-8", "replace"))
            if len(batch) == most:
                yield batch
                batch = []
            if buffer[end] == 0x0D:
                if end + 1 < len(buffer):
                    start = end + 2 if buffer[end + 1] == 0x0A else end + 1
                else:
                    start, cr_pending = end + 1, True
            else:
                start = end + 1
            scanned = start
        del buffer[:start]
        scanned -= start
        if batch:
            yield batch
        if len(buffer) > line_limit:
            raise ResponseRefused(
                "line_too_long",
                f"a line of the stream was longer than {line_limit} bytes, "
                "so it was not read further (the limit: AGENTOPS_PROVIDER_MAX_LINE_BYTES)",
            )
    if buffer:
        yield [buffer.decode("utf-8", "replace")]


def json_bytes(value: Any) -> bytes:
    """A request body as JSON: compact, UTF-8, no NaN or infinity (no provider reads them)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode(
        "utf-8"
    )
