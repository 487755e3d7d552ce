"""Reading a stated wait and spreading retries: shared by provider calls (``calls``)
and webhook deliveries (``agentops.webhooks``), so both read a ``retry-after`` alike and drift
apart alike. Pure: values and ``now`` in, values out."""

from __future__ import annotations

import math
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any


def wait_number(value: Any) -> float | None:
    """A number from a header or body value; None when absent, NaN for a value that is present
    but not a finite number. ``"12s"`` reads as 12."""
    if value is None:
        return None
    if isinstance(value, bool):
        return math.nan
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("s") and not text.endswith("ms"):
            text = text[:-1]
        try:
            return float(text)
        except ValueError:
            return math.nan
    return math.nan


def clamp_wait(value: float) -> float:
    """A negative wait means 0; NaN and ±inf stay as they are (architecture.md §5.6)."""
    if math.isnan(value) or math.isinf(value):
        return value
    return max(0.0, value)


def retry_after_header_ms(raw: str, now_ms: float) -> float:
    """A ``retry-after`` header's wait in ms from ``now_ms``: delay-seconds or an HTTP date. An
    HTTP date is GMT by definition, so one whose zone is missing or ``-0000`` is read as UTC.
    Negative or past means 0; NaN for a value that does not read, ±inf for an infinite one."""
    text = raw.strip()
    value = wait_number(text)
    if value is not None and not math.isnan(value):
        return clamp_wait(value * 1000)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return math.nan
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return clamp_wait(when.timestamp() * 1000 - now_ms)


def jittered(delay_ms: float, jitter: float) -> float:
    """``delay_ms`` spread by up to half again (``jitter`` in [0, 1)), so callers that failed
    together do not all come back in the same instant."""
    return delay_ms * (1 + 0.5 * jitter)
