"""The one clock read of provider waits: interfaces read ``now`` once and pass it down."""

from __future__ import annotations

import time


def clock_ms() -> float:
    """Milliseconds since the Unix epoch, UTC."""
    return time.time() * 1000
