"""The one outbound request of a delivery attempt: POST the signed body to an address that was
checked, read a bounded part of the answer. Never raises for what the receiver or the network
does; the answer says it."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from agentops.outbound import outbound
from agentops.runtime import Runtime
from agentops.text import bound_text, untrusted_text
from agentops.urlsafety import IPAddress

# What is kept of a receiver's answer: it is the receiver's text, of any size.
EXCERPT_BYTES = 4096
EXCERPT_CHARS = 1000
ERROR_CHARS = 500
USER_AGENT = "agentops-webhooks/1"


@dataclass(frozen=True)
class Answer:
    status_code: int | None  # None: no answer (connection error, timeout)
    retry_after: str | None
    excerpt: str
    error: str
    duration_ms: float


def post_signed(
    rt: Runtime,
    *,
    url: str,
    addresses: Sequence[IPAddress],
    headers: dict[str, str],
    body: bytes,
    timeout_s: float,
    verify: ssl.SSLContext | bool = True,
) -> Answer:
    """POST ``body`` to ``url``'s host at one of ``addresses`` (what the host resolved to when
    it was checked; tried in turn while they refuse the connection), on the loop of ``rt``,
    the process's runtime (``agentops.outbound``); the calling thread waits. The name is never
    resolved again: the request carries it in the Host header and, over https, in TLS SNI, and
    the certificate is verified against it. No redirects followed, no proxies from the
    environment (the URL was checked, not wherever a redirect or proxy would take it).
    ``timeout_s`` covers the whole attempt. ``verify`` is for tests that bring their own
    certificate authority."""
    start = time.monotonic()
    if not addresses:
        return Answer(
            status_code=None,
            retry_after=None,
            excerpt="",
            error="no address to connect to",
            duration_ms=0.0,
        )
    attempt = _post(
        url=url, addresses=addresses, headers=headers, body=body, timeout_s=timeout_s, verify=verify
    )
    try:
        status, retry_after, excerpt = rt.submit(attempt).result()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if isinstance(exc, TimeoutError):
            what = f"{type(exc).__name__}: no answer within {timeout_s:g} s"
        return Answer(
            status_code=None,
            retry_after=None,
            excerpt="",
            error=bound_text(untrusted_text(what), ERROR_CHARS),
            duration_ms=(time.monotonic() - start) * 1000,
        )
    return Answer(
        status_code=status,
        retry_after=untrusted_text(retry_after[:200]) if retry_after else None,
        excerpt=bound_text(untrusted_text(excerpt), EXCERPT_CHARS),
        error="",
        duration_ms=(time.monotonic() - start) * 1000,
    )


async def _post(
    *,
    url: str,
    addresses: Sequence[IPAddress],
    headers: dict[str, str],
    body: bytes,
    timeout_s: float,
    verify: ssl.SSLContext | bool,
) -> tuple[int, str | None, str]:
    """One attempt: the status, the retry-after header and the start of the body (enough to
    tell an operator what the receiver said; a trickling body does not hold it past the timeout)."""
    async with asyncio.timeout(timeout_s):
        request = outbound().request(
            url,
            body=body,
            headers={**headers, "User-Agent": USER_AGENT},
            addresses=addresses,
            proxied=False,
            ssl=verify,
        )
        async with request as response:
            received = bytearray()
            async for chunk in response.content.iter_any():
                received += chunk
                if len(received) >= EXCERPT_BYTES:
                    break
            return (
                response.status,
                response.headers.get("retry-after") or None,
                received[:EXCERPT_BYTES].decode("utf-8", "replace"),
            )
