"""The one outbound request of a delivery attempt: POST the signed body, read a bounded part of
the answer. Never raises for what the receiver or the network does; the answer says it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx

from agentops.text import bound_text

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


def post_signed(*, url: str, headers: dict[str, str], body: bytes, timeout_s: float) -> Answer:
    """POST ``body``; no redirects followed, no proxies from the environment (the URL was
    checked, not wherever a redirect or proxy would take it)."""
    start = time.monotonic()
    try:
        with (
            httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False) as client,
            client.stream("POST", url, content=body, headers={**headers, "user-agent": USER_AGENT}) as response,
        ):
            received = bytearray()
            for chunk in response.iter_bytes():
                received += chunk
                # Enough to tell an operator what the receiver said; a trickling body does not
                # hold the worker past the timeout.
                if len(received) >= EXCERPT_BYTES or time.monotonic() - start > timeout_s:
                    break
            text = received[:EXCERPT_BYTES].decode("utf-8", errors="replace")
            return Answer(
                status_code=response.status_code,
                retry_after=(response.headers.get("retry-after") or None) and response.headers["retry-after"][:200],
                excerpt=bound_text(text, EXCERPT_CHARS),
                error="",
                duration_ms=(time.monotonic() - start) * 1000,
            )
    except httpx.HTTPError as exc:
        return Answer(
            status_code=None, retry_after=None, excerpt="",
            error=bound_text(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, ERROR_CHARS),
            duration_ms=(time.monotonic() - start) * 1000,
        )
