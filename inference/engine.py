"""The call engine: one asyncio event loop per worker process, in its own thread.

Celery runs turns on a thread pool (``--pool threads``). Each task thread compiles its request
and records results with the ORM, but the call itself (the socket, the stream reader, the
deadline watcher) runs as a coroutine on this shared loop. So one process holds many calls
at once at the cost of one coroutine each, not one process or one event loop each, and a cut
is timed by a loop that does nothing but read streams.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import redis.asyncio

T = TypeVar("T")


class CallEngine:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._redis: redis.asyncio.Redis | None = None
        self.thread = threading.Thread(target=self._run, name="agentops-call-engine", daemon=True)
        self.thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the engine's loop; the caller waits on the returned future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def redis(self, url: str) -> redis.asyncio.Redis:
        """A Redis client bound to the engine's loop (call from a coroutine on it)."""
        if self._redis is None:
            self._redis = redis.asyncio.Redis.from_url(url, max_connections=50)
        return self._redis


_engine: CallEngine | None = None
_engine_pid: int | None = None
_lock = threading.Lock()


def call_engine() -> CallEngine:
    """This process's engine, started on first use (after any fork, so each child has its own)."""
    global _engine, _engine_pid
    with _lock:
        if _engine is None or _engine_pid != os.getpid():
            _engine, _engine_pid = CallEngine(), os.getpid()
        return _engine
