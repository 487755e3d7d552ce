"""A worker's warm shutdown, as one process-wide flag (architecture.md §6.10).

What waits (a turn's retry delay, a call that ends on shutdown) registers a wake here; shutdown
sets them all, so a waiting turn is handed back at once instead of making its call on the way
out. Work the process must finish before it exits (the turns running on the background loop,
whose Celery tasks returned when they handed them over) is counted here: a worker's warm
shutdown waits for that count to be back to zero (``wait_idle``) before the process exits.
"""

from __future__ import annotations

import threading
from typing import Protocol

stopping = threading.Event()


class Wake(Protocol):
    """A ``threading.Event``, or what stands for one on the loop (``background.LoopWake``)."""

    def set(self) -> None: ...


_waiters: set[Wake] = set()
_lock = threading.Lock()
_running = 0
_idle = threading.Condition(_lock)


def shutdown_begin() -> None:
    stopping.set()
    with _lock:
        for event in _waiters:
            event.set()


def wake_on_shutdown(event: Wake) -> None:
    with _lock:
        _waiters.add(event)
        if stopping.is_set():
            event.set()


def forget(event: Wake) -> None:
    with _lock:
        _waiters.discard(event)


def work_started() -> None:
    """Count a piece of work (a turn's run) the process finishes before it exits."""
    global _running
    with _lock:
        _running += 1


def work_ended() -> None:
    global _running
    with _lock:
        _running -= 1
        if _running == 0:
            _idle.notify_all()


def wait_idle() -> None:
    """Return once no counted work is left. Call it before the process begins to exit: the
    interpreter's exit stops the thread pools that work needs."""
    with _lock:
        _idle.wait_for(lambda: _running == 0)
