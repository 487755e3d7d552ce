"""The background loop: one asyncio event loop per process, in its own thread.

A worker runs each agent's turns as one coroutine on this loop (``turns.drain``): the
call itself (the socket, the stream reader, the deadline timer) and the waits between calls
cost a coroutine each, not a thread. The ORM bookkeeping around them (claiming, compiling,
recording) is blocking, so it runs in a small pool of threads (``bookkeeping``), whose size
bounds how many turns touch the database at once however many calls are held. Live events are
sent from the same loop, over one channel-layer connection pool, instead of a new event loop
and Redis connection per event.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextvars
import os
import sys
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, ParamSpec, TypeVar

import uvloop
from django.conf import settings

from . import telemetry
from .cancels import AbortWatcher
from .outbound import outbound_close

T = TypeVar("T")
P = ParamSpec("P")
# How long a process that is exiting waits for its live events to go out.
EXIT_FLUSH_S = 2.0
# Live events handed over within this long of one another go out together (one round trip
# for their groups' question, ``agentops.live``): a few milliseconds nobody watching sees.
OUTBOX_GATHER_S = 0.005


def _yield_to_the_loop() -> None:
    """In a bookkeeping thread as it starts: raise its niceness by ``AGENTOPS_BOOKKEEPING_NICE``
    (Linux schedules each thread on its own), so where the cores are full the loop that times
    every call's cuts gets one before the bookkeeping does. Raising one's niceness needs no
    privilege; the loop, the lease renewer and the rest of the process keep theirs."""
    nice = settings.AGENTOPS_BOOKKEEPING_NICE
    if nice and sys.platform.startswith("linux"):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + nice, 19))


class BackgroundLoop:
    def __init__(self) -> None:
        # uvloop, as the web app's under uvicorn: a closed connection's transport leaves no
        # cycle for the collector (asyncio's own keeps one, about 7 objects a closed connection,
        # which a worker's frozen generations would hold until a sweep).
        self.loop = uvloop.new_event_loop()
        self._ready = threading.Event()
        self._outbox: collections.deque[Coroutine[Any, Any, None] | _Batched] = collections.deque()
        self._sender: asyncio.Task[None] | None = None
        self._started: set[asyncio.Task[Any]] = set()  # the loop keeps only weak references
        self._aborts: AbortWatcher | None = None
        self.bookkeeping_pool = ThreadPoolExecutor(
            max_workers=settings.AGENTOPS_BOOKKEEPING_THREADS,
            thread_name_prefix="agentops-bookkeeping",
            initializer=_yield_to_the_loop,
        )
        self.thread = threading.Thread(
            target=self._run, name="agentops-background-loop", daemon=True
        )
        self.thread.start()
        self._ready.wait()

    def _run(self) -> None:
        # Hand the GIL over more often than the default 5 ms, so the loop that times cuts
        # gets it back quickly from threads doing bookkeeping.
        sys.setswitchinterval(0.001)
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    def send_in_order(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` after every coroutine handed here before it (from any thread): live
        events go out in the order they happened. Fire and forget."""
        self._hand(coro)

    def send_batched_in_order(
        self, send: Callable[[list[Any]], Coroutine[Any, Any, None]], item: Any
    ) -> None:
        """Like ``send_in_order`` for ``send([item])``, except that the items handed here one
        after another for the same ``send`` (a module-level function) while the one before
        them went out reach it together, in order, in one list: a burst of live events costs
        one round trip, not one each."""
        self._hand(_Batched(send, item))

    def _hand(self, entry: Coroutine[Any, Any, None] | _Batched) -> None:
        # On the loop's own thread no wake-up is needed (every send from this thread takes
        # this path, so their order holds).
        if threading.get_ident() == self.thread.ident:
            self._enqueue(entry)
        else:
            self.loop.call_soon_threadsafe(self._enqueue, entry)

    def _enqueue(self, entry: Coroutine[Any, Any, None] | _Batched) -> None:
        self._outbox.append(entry)
        if self._sender is None or self._sender.done():
            self._sender = self.loop.create_task(self._drain_outbox())

    async def _drain_outbox(self) -> None:
        outbox = self._outbox
        await asyncio.sleep(OUTBOX_GATHER_S)
        while outbox:
            entry = outbox.popleft()
            if not isinstance(entry, _Batched):
                await entry
                continue
            items = [entry.item]
            while (
                outbox
                and isinstance(following := outbox[0], _Batched)
                and following.send is entry.send
            ):
                items.append(following.item)
                outbox.popleft()
            await entry.send(items)

    def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds until every coroutine handed to ``send_in_order``
        so far has run. A short-lived process (a management command releasing a wait, raising
        an alert) calls it at exit: the loop's thread is a daemon, and would die with the
        events still queued."""

        async def drained() -> None:
            while self._sender is not None and not self._sender.done():
                await asyncio.shield(self._sender)

        try:
            self.submit(drained()).result(timeout)
        except Exception:  # best effort, like the events themselves
            pass

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the engine's loop; the caller waits on the returned future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def start(
        self, coro: Coroutine[Any, Any, T], on_done: Callable[[asyncio.Task[T]], None]
    ) -> None:
        """Run ``coro`` as a task on the loop, from any thread, and call ``on_done`` with it on
        the loop when it ends; for work nobody waits on (an agent's run). Unlike ``submit``, no
        thread-side future is chained to the task: that future, its condition and its callbacks
        cost about a kilobyte on every call a worker holds."""
        self.loop.call_soon_threadsafe(self._start, coro, on_done)

    def _start(
        self, coro: Coroutine[Any, Any, T], on_done: Callable[[asyncio.Task[T]], None]
    ) -> None:
        task = self.loop.create_task(coro)
        self._started.add(task)
        task.add_done_callback(self._started.discard)
        task.add_done_callback(on_done)

    def watch_cancel(self, key: str, abort: Callable[[], None]) -> Callable[[], None]:
        """Call ``abort`` (on the loop) once the Redis key ``key`` exists, set before or after
        this call; returns an unwatch. The key must be set with ``agentops.cancels.abort_signal``,
        which also publishes it: the process's one subscription hears it at once (see there).
        Call from the loop."""
        if self._aborts is None:
            self._aborts = AbortWatcher(self.loop, lambda: str(settings.REDIS_URL))
        return self._aborts.watch(key, abort)


@dataclass(frozen=True, slots=True)
class _Batched:
    """An item for ``send``, in the outbox (``BackgroundLoop.send_batched_in_order``)."""

    send: Callable[[list[Any]], Coroutine[Any, Any, None]]
    item: Any


class LoopWake:
    """What a thread sets to wake a coroutine on the loop: ``set()`` from any thread (the lease
    renewer, a warm shutdown, a cancel) resolves ``future``, which the coroutine awaits. It
    stands where a thread would pass a ``threading.Event``."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def set(self) -> None:
        self._loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


async def bookkeeping(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn`` (blocking ORM work) in the process's bookkeeping pool and await it, from a
    coroutine on the background loop. The pool's few threads keep their database connection
    from one piece of work to the next (taking one from the connection pool each time costs a
    round trip for its health check); a connection is dropped when its work fails on it, so a
    dead one is never used twice."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        background_loop().bookkeeping_pool, _in_context(partial(_keeping, fn, *args, **kwargs))
    )


def _keeping(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    from django.db import connection

    try:
        return fn(*args, **kwargs)
    except BaseException:
        connection.close()
        raise


async def blocking(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run ``fn`` on a thread of the loop's own and await it: for work that waits (the
    breaker's probe, made by a thread waiting on this loop), kept out of the bookkeeping pool
    so that it never holds a bookkeeping thread while it waits."""
    return await asyncio.get_running_loop().run_in_executor(
        None, _in_context(partial(_closing, fn, *args, **kwargs))
    )


def _in_context(work: Callable[[], T]) -> Callable[[], T]:
    """``work`` to run in a copy of the coroutine's context when telemetry is exported, so a
    thread's spans and log lines belong to the turn the coroutine runs (an executor, unlike
    ``asyncio.to_thread``, carries no context over); as it is otherwise."""
    if not telemetry.enabled:
        return work
    return partial(contextvars.copy_context().run, work)


def _closing(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    from django.db import connection

    try:
        return fn(*args, **kwargs)
    finally:
        connection.close()


class PerProcess(Generic[T]):
    """One ``factory()`` per process, made on first use and again after a fork (a child makes
    its own: threads and loops do not survive a fork). Call it to get this process's one."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._made: T | None = None
        self._pid: int | None = None
        self._lock = threading.Lock()

    def __call__(self) -> T:
        with self._lock:
            if self._made is None or self._pid != os.getpid():
                self._made, self._pid = self._factory(), os.getpid()
            return self._made

    def made(self) -> T | None:
        """This process's one if it was made, without making it."""
        return self._made if self._pid == os.getpid() else None


# This process's loop, started on first use.
background_loop = PerProcess(BackgroundLoop)


def _flush_at_exit() -> None:
    if (loop := background_loop.made()) is not None:
        loop.flush(EXIT_FLUSH_S)
        try:  # its kept provider connections, closed rather than left for the collector to warn of
            loop.submit(outbound_close()).result(EXIT_FLUSH_S)
        except Exception:  # best effort, at exit
            pass


atexit.register(_flush_at_exit)
