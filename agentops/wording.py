"""How durations, instants and long messages read to a person: in alerts, log lines, the admin
and the dashboard. ``2 h``, ``20 min``, ``45 s``, an instant in UTC to the second, and an
excerpt cut at a word boundary rather than mid-word."""

from __future__ import annotations

import math
from datetime import UTC, datetime

_UNITS = (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000))


def duration_text(ms: float | None) -> str:
    """A span as people say it: ``2 h``, ``1 h 30 min``, ``20 min``, ``45 s``, ``1.5 s``,
    ``250 ms``; at most two units, the smaller one only when it is not zero. ``None`` or a
    span that is not a finite number reads ``until released``."""
    if ms is None or isinstance(ms, bool) or not math.isfinite(ms):
        return "until released"
    if ms < 0:
        return "-" + duration_text(-ms)
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 10_000:
        tenths = round(ms / 100) / 10
        return f"{tenths:g} s"
    left = round(ms / 1000) * 1000
    parts: list[str] = []
    for name, size in _UNITS:
        count, left = divmod(left, size)
        if count and len(parts) < 2:
            parts.append(f"{count:.0f} {name}")
        elif parts:
            break
    return " ".join(parts)


def instant_text(value: datetime | float | None) -> str:
    """An instant (a datetime, or epoch milliseconds) in UTC to the second:
    ``2027-01-15 10:00:00 UTC``."""
    if value is None:
        return "never"
    moment = value if isinstance(value, datetime) else datetime.fromtimestamp(value / 1000, tz=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def excerpt(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, cut at the last word boundary before the
    limit (and marked with an ellipsis) when it is longer; a single overlong word is cut."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    room = max(limit - 1, 1)
    cut = text[:room]
    space = cut.rfind(" ")
    if space >= room // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.-(") + "…"
