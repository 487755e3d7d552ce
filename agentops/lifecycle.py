"""A worker's warm shutdown, as one process-wide flag (DESIGN §6.10).

Threads that wait (a retry delay) register an event here; shutdown sets them all, so a waiting
turn is handed back at once instead of making its call on the way out.
"""

from __future__ import annotations

import threading

stopping = threading.Event()
_waiters: set[threading.Event] = set()
_lock = threading.Lock()


def shutdown_begin() -> None:
    stopping.set()
    with _lock:
        for event in _waiters:
            event.set()


def wake_on_shutdown(event: threading.Event) -> None:
    with _lock:
        _waiters.add(event)
        if stopping.is_set():
            event.set()


def forget(event: threading.Event) -> None:
    with _lock:
        _waiters.discard(event)
