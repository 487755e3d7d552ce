"""The one outbound request of a delivery attempt: POST the signed body to an address that was
checked, read a bounded part of the answer. Never raises for what the receiver or the network
does; the answer says it."""

from __future__ import annotations

import ipaddress
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from agentops.text import bound_text
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
    *,
    url: str,
    addresses: Sequence[IPAddress],
    headers: dict[str, str],
    body: bytes,
    timeout_s: float,
    verify: ssl.SSLContext | bool = True,
) -> Answer:
    """POST ``body`` to ``url``'s host at one of ``addresses`` (what the host resolved to when
    it was checked; tried in order while they refuse the connection). The name is never
    resolved again: the request carries it in the Host header and, over https, in TLS SNI, and
    the certificate is verified against it. No redirects followed, no proxies from the
    environment (the URL was checked, not wherever a redirect or proxy would take it).
    ``verify`` is for tests that bring their own certificate authority."""
    start = time.monotonic()
    answer = Answer(status_code=None, retry_after=None, excerpt="", error="no address to connect to", duration_ms=0.0)
    for address in addresses:
        # The attempt's timeout covers every address tried, not each one.
        left = timeout_s - (time.monotonic() - start)
        if left <= 0:
            break
        answer, refused = _post_to(url=url, address=address, headers=headers, body=body, timeout_s=left, verify=verify, start=start)
        if not refused:
            break
    return answer


def _post_to(
    *, url: str, address: IPAddress, headers: dict[str, str], body: bytes, timeout_s: float, verify: ssl.SSLContext | bool, start: float
) -> tuple[Answer, bool]:
    """One try at one address: the answer, and whether the connection itself was refused (so
    the next address may be tried)."""
    target = httpx.URL(url)
    extensions: dict[str, str] = {}
    if not _is_ip(target.host):
        # Connect to the checked address; the name goes in the Host header and TLS SNI, and the
        # certificate is verified against the name (httpcore's server_hostname).
        extensions["sni_hostname"] = target.raw_host.decode("ascii")
    pinned = target.copy_with(host=str(address))
    request_headers = {**headers, "user-agent": USER_AGENT, "host": target.netloc.decode("ascii")}
    try:
        with (
            httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False, verify=verify) as client,
            client.stream("POST", pinned, content=body, headers=request_headers, extensions=extensions) as response,
        ):
            received = bytearray()
            for chunk in response.iter_bytes():
                received += chunk
                # Enough to tell an operator what the receiver said; a trickling body does not
                # hold the worker past the timeout.
                if len(received) >= EXCERPT_BYTES or time.monotonic() - start > timeout_s:
                    break
            text = received[:EXCERPT_BYTES].decode("utf-8", errors="replace")
            retry_after = response.headers.get("retry-after") or None
            return Answer(
                status_code=response.status_code,
                retry_after=retry_after[:200] if retry_after else None,
                excerpt=bound_text(text, EXCERPT_CHARS),
                error="",
                duration_ms=(time.monotonic() - start) * 1000,
            ), False
    except httpx.HTTPError as exc:
        return Answer(
            status_code=None, retry_after=None, excerpt="",
            error=bound_text(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, ERROR_CHARS),
            duration_ms=(time.monotonic() - start) * 1000,
        ), isinstance(exc, httpx.ConnectError)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
