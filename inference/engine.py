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
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import redis.asyncio

T = TypeVar("T")
# How often the process checks whether any of its calls' turns was cancelled.
CANCEL_POLL_S = 0.25


class CallEngine:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._watched: dict[str, Callable[[], None]] = {}
        self._poller: asyncio.Task[None] | None = None
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

    def watch_cancel(self, key: str, abort: Callable[[], None]) -> Callable[[], None]:
        """Call ``abort`` (on the loop) once the Redis key ``key`` exists; returns an unwatch.

        One poller per process checks every watched key in a single MGET per interval, so a
        thousand calls in flight cost one round trip, not a thousand. Call from the loop."""
        self._watched[key] = abort
        if self._poller is None or self._poller.done():
            self._poller = self.loop.create_task(self._poll_cancels())
        return lambda: self._watched.pop(key, None)  # type: ignore[func-returns-value]

    async def _poll_cancels(self) -> None:
        from django.conf import settings

        client = redis.asyncio.Redis.from_url(settings.REDIS_URL)
        try:
            while self._watched:
                await asyncio.sleep(CANCEL_POLL_S)
                keys = list(self._watched)
                try:
                    values = await client.mget(keys)
                except redis.RedisError:
                    continue  # the runner re-reads the turn's status after every call
                for key, value in zip(keys, values, strict=True):
                    if value is not None and (abort := self._watched.pop(key, None)) is not None:
                        abort()
        finally:
            await client.aclose()


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
