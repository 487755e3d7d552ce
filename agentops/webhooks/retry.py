"""What an attempt's answer means for its delivery (architecture.md §8): a pure function of the
answer, the attempt count, the settings and ``now``. No I/O, no clock reads.

2xx delivers. 410 Gone fails and disables the endpoint. Other 4xx (but 408 and 429) fail for
good: the receiver has said the message itself is wrong, so sending it again cannot help. 5xx,
408, 429 and connection errors are retried with exponential backoff and jitter, waiting at least
as long as a ``retry-after`` header asks (up to the cap), until the attempts run out.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from datetime import datetime

from agentops.retrying import jittered, retry_after_header_ms

RETRYABLE_4XX = frozenset({408, 429})
GONE = 410


class Next(enum.Enum):
    DELIVERED = "delivered"
    RETRY = "retry"
    FAIL = "fail"
    GIVE_UP = "give_up"
    DISABLE = "disable"  # fail, and disable the endpoint


@dataclass(frozen=True)
class Verdict:
    next: Next
    reason: str
    delay_ms: float | None = None  # only for RETRY


def retry_after_ms(raw: str | None, *, now: datetime) -> float | None:
    """A ``retry-after`` value in milliseconds from ``now``: delay-seconds or an HTTP date, read
    as a provider's is read (a date without a zone is GMT). None if absent, unreadable or
    not finite; never negative (a past date or negative seconds mean "now")."""
    if raw is None or not raw.strip():
        return None
    wait = retry_after_header_ms(raw, now.timestamp() * 1000)
    return wait if math.isfinite(wait) else None


def backoff_ms(*, attempt: int, base_ms: float, max_ms: float, jitter: float) -> float:
    """The wait after failed attempt number ``attempt`` (1-based): base doubled per attempt,
    capped, then spread by up to half again (``jitter`` in [0, 1)) so a receiver that comes back
    is not hit by every queued delivery in the same instant."""
    plain = min(max_ms, base_ms * 2 ** min(attempt - 1, 60))
    return min(max_ms, jittered(plain, jitter))


def attempt_verdict(
    *,
    status_code: int | None,
    error: str = "",
    retry_after: str | None = None,
    attempt: int,
    max_attempts: int,
    base_ms: float,
    max_ms: float,
    jitter: float,
    now: datetime,
) -> Verdict:
    """Decide what follows an attempt. ``status_code`` is None when no answer came (connection
    error, timeout; ``error`` says which). ``attempt`` counts the attempts of this cycle, this
    one included."""
    if status_code is not None and 200 <= status_code < 300:
        return Verdict(Next.DELIVERED, f"HTTP {status_code}")
    if status_code == GONE:
        return Verdict(
            Next.DISABLE, "HTTP 410 Gone: the receiver says this endpoint is gone; it was disabled"
        )
    if status_code is not None and 300 <= status_code < 400:
        return Verdict(
            Next.FAIL,
            f"HTTP {status_code}: redirects are not followed; point the endpoint at the final URL",
        )
    if status_code is not None and 400 <= status_code < 500 and status_code not in RETRYABLE_4XX:
        return Verdict(
            Next.FAIL, f"HTTP {status_code}: the receiver refused the message; not retried"
        )
    reason = f"HTTP {status_code}" if status_code is not None else (error or "no answer")
    if attempt >= max_attempts:
        return Verdict(Next.GIVE_UP, f"{reason}; gave up after {attempt} attempt(s)")
    delay = backoff_ms(attempt=attempt, base_ms=base_ms, max_ms=max_ms, jitter=jitter)
    stated = retry_after_ms(retry_after, now=now) if status_code is not None else None
    if stated is not None:
        delay = max(delay, min(stated, max_ms))
    return Verdict(Next.RETRY, f"{reason}; retrying", delay_ms=delay)
