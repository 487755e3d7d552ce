"""The process's runtime: one object that owns what runs beside the code (architecture.md §2,
"The runtime").

A worker runs each agent's turns as coroutines on one asyncio loop in a thread of its own; the
web process uses the same loop for live events, progress and cancels. Everything that outlives
one call of a function lives on the one ``Runtime`` of the process: the loop and its thread,
the database pool (the one way the loop reaches the ORM: ``db`` and ``db_durably``), the outbox
of live events, the cancel watcher and the warm shutdown (its flag, its wakes and the count of
runs it waits for). Each higher floor's runtime is a subclass that adds its floor's parts as
named attributes (``calls.engine.CallRuntime``, ``turns.runtime.TurnRuntime``,
``turns.drain.WorkerRuntime``), made with it and stopped with it.

A process builds its one runtime at its entry point and stops it at its end (the worker at
``worker_init`` and its shutdown, the web in the ASGI lifespan, ``manage.py`` around a command,
the tests in a session fixture), and ``install`` it. Code is handed the runtime (or its ``db``)
as a parameter, and a request or socket carries the web's in its scope (``interfaces.edge``);
``installed`` is for what receives nothing (a Celery task, a live event sent after a commit),
each saying why.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, ParamSpec, Protocol, TypeVar

import uvloop
from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from . import telemetry
from .cancels import AbortWatcher
from .outbound import outbound_close

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")
RuntimeT = TypeVar("RuntimeT", bound="Runtime")

# How long a process that is exiting waits for its live events to go out.
EXIT_FLUSH_S = 2.0
# Live events handed over within this long of one another go out together (one round trip
# for their groups' question, ``agentops.live``): a few milliseconds nobody watching sees.
OUTBOX_GATHER_S = 0.005
# Errors that mean "the database did not answer", not "the query is wrong": ``db_durably``
# tries again after a backoff growing from the first to the last of these.
UNREACHABLE = (OperationalError, InterfaceError)
BACKOFF_FIRST_S = 0.05
BACKOFF_MAX_S = 0.25


class LeaseLost(Exception):
    """What ``db_durably`` waited on is no longer this process's (its lease was taken over
    while the database did not answer)."""


class NoRuntime(RuntimeError):
    """Code that needs the process's runtime ran where no entry point built one."""


class Part(Protocol):
    """What a higher floor's runtime keeps as a named attribute: made with it, stopped with
    it (``Runtime.parts``)."""

    async def stop(self) -> None: ...


class Settable(Protocol):
    """What a thread sets to wake whoever waits: a ``threading.Event``, or a ``Wake``."""

    def set(self) -> None: ...


class Wake:
    """What a thread sets to wake a coroutine on the loop: ``set()`` from any thread (the lease
    renewer, a warm shutdown, a cancel) resolves ``future``, which the coroutine awaits."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def set(self) -> None:
        self._loop.call_soon_threadsafe(self._resolve)

    def _resolve(self) -> None:
        if not self.future.done():
            self.future.set_result(None)


def backoff_delays() -> Iterator[float]:
    delay = BACKOFF_FIRST_S
    while True:
        yield delay
        delay = min(delay * 2, BACKOFF_MAX_S)


class Runtime:
    """One per process (built at its entry point, ``install``), started with what it needs. In
    a ``worker`` the database threads keep their connection from one piece of work to the next
    (taking one from the pool costs a round trip for its health check each time) and run at a
    lower OS priority than the loop that times every call's cuts; in the web and in commands
    each gives its connection back when done (the requests need the pool's connections too)."""

    def __init__(self, *, worker: bool) -> None:
        self.worker = worker
        self.loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="agentops-loop", daemon=True)
        self.pool = ThreadPoolExecutor(
            # The web's async views each hop for their token, agent and call row: as many
            # threads as asyncio's own default executor, not a worker's few.
            max_workers=settings.AGENTOPS_BOOKKEEPING_THREADS if worker else None,
            thread_name_prefix="agentops-db",
            initializer=_yield_to_the_loop if worker else None,
        )
        self.stopping = threading.Event()
        self._stopped = False
        self._lock = threading.Lock()
        self._wakes: set[Settable] = set()
        self._running = 0
        self._idle = threading.Condition(self._lock)
        self._outbox: collections.deque[Coroutine[Any, Any, None] | _Batched] = collections.deque()
        self._sender: asyncio.Task[None] | None = None
        self._aborts: AbortWatcher | None = None
        self._kept: set[asyncio.Future[Any]] = set()

    # --- start and stop ---------------------------------------------------------------------

    def start(self) -> None:
        """Start the loop's thread (once)."""
        if self.thread.is_alive():
            return
        ready = threading.Event()
        self.loop.call_soon(ready.set)
        self.thread.start()
        ready.wait()

    def _run(self) -> None:
        # Hand the GIL over more often than the default 5 ms, so the loop that times cuts
        # gets it back quickly from threads doing bookkeeping.
        sys.setswitchinterval(0.001)
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def stop(self, timeout: float = EXIT_FLUSH_S) -> None:
        """Send what is in the outbox, stop the parts, close the cancel watcher and the kept
        provider connections; best effort within ``timeout`` (a process on its way out)."""
        if not self.thread.is_alive() or self._stopped:
            return
        self._stopped = True
        try:
            self.submit(self._stop()).result(timeout)
        except Exception:  # best effort, at exit
            logger.debug("the runtime did not stop cleanly", exc_info=True)

    async def _stop(self) -> None:
        await self._outbox_drained()
        for part in self.parts():
            await part.stop()
        if self._aborts is not None:
            await self._aborts.aclose()
        await outbound_close()

    # --- from threads to the loop -----------------------------------------------------------

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the loop; the calling thread waits on the returned future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def keep_until_done(self, task: asyncio.Future[Any]) -> None:
        """Hold ``task``, which nothing awaits (a quota note, a key's release), until it is
        done: the loop it runs on (this one or the web's) holds its tasks only weakly."""
        self._kept.add(task)
        task.add_done_callback(self._kept.discard)

    # --- from the loop to the database ------------------------------------------------------

    async def db(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` (blocking ORM work) in the runtime's database threads and await it, from
        any running loop. A connection whose work failed on it is dropped, so a dead one is
        never used twice."""
        work = partial(self._in_thread, fn, *args, **kwargs)
        if telemetry.enabled:  # the thread's spans and log lines belong to the coroutine's turn
            work = partial(contextvars.copy_context().run, work)
        return await asyncio.get_running_loop().run_in_executor(self.pool, work)

    def _in_thread(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            connection.close()
            raise
        if not self.worker and not connection.in_atomic_block:
            connection.close()
        return result

    async def db_durably(
        self,
        fn: Callable[[], T],
        *,
        what: str,
        still_ours: Callable[[], bool] | None = None,
        recovered: Callable[[], object] | None = None,
    ) -> T:
        """``db(fn)`` until the database answers it: for bookkeeping that must not be lost (a
        call's row once the call was made, an answer received). ``fn`` must be safe to run
        again. While the database does not answer, it is tried again after a backoff of at most
        ``BACKOFF_MAX_S``, without a thread waiting meanwhile; ``still_ours`` (the lease's
        renewal) is asked at each try and raises ``LeaseLost`` once it says no. ``recovered``
        runs once it answered after an outage (pending journal acts offered)."""
        failed_at: float | None = None
        delays = backoff_delays()
        while True:
            try:
                result = await self.db(fn)
            except UNREACHABLE as exc:
                if failed_at is None:
                    failed_at = time.monotonic()
                    logger.warning(
                        "%s: the database did not answer (%s: %s); trying again until it does",
                        what,
                        type(exc).__name__,
                        str(exc)[:200],
                    )
                await asyncio.sleep(next(delays))
                if still_ours is not None and not await self.db(still_ours):
                    raise LeaseLost(what) from exc
                continue
            if failed_at is not None:
                logger.warning(
                    "%s: done after the database came back (%.1f s)",
                    what,
                    time.monotonic() - failed_at,
                )
                if recovered is not None:
                    await self.db(recovered)
            return result

    # --- parts of higher floors -------------------------------------------------------------

    def parts(self) -> tuple[Part, ...]:
        """The higher floors' parts, in the order ``stop`` stops them (each subclass puts its
        own first: what a floor runs on stops after it)."""
        return ()

    # --- warm shutdown ----------------------------------------------------------------------

    def begin_shutdown(self) -> None:
        """A worker's warm shutdown began: every registered wake is set (a waiting turn is
        handed back at once) and no new run is taken."""
        self.stopping.set()
        with self._lock:
            for wake in self._wakes:
                wake.set()

    def wake_on_shutdown(self, wake: Settable) -> Callable[[], None]:
        """Set ``wake`` when the warm shutdown begins (at once if it has); returns the undo."""
        with self._lock:
            self._wakes.add(wake)
        if self.stopping.is_set():
            wake.set()
        return partial(self._forget_wake, wake)

    def _forget_wake(self, wake: Settable) -> None:
        with self._lock:
            self._wakes.discard(wake)

    def work_started(self) -> None:
        """Count a piece of work (an agent's run) the process finishes before it exits."""
        with self._lock:
            self._running += 1

    def work_ended(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self._idle.notify_all()

    def wait_idle(self) -> None:
        """Return once no counted work is left. Call before the process begins to exit: the
        interpreter's exit stops the thread pools that work needs."""
        with self._lock:
            self._idle.wait_for(lambda: self._running == 0)

    # --- live events ------------------------------------------------------------------------

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

    async def _outbox_drained(self) -> None:
        while self._sender is not None and not self._sender.done():
            await asyncio.shield(self._sender)

    def flush(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds until every coroutine handed to ``send_in_order``
        so far has run (a short-lived process at exit: the loop's thread is a daemon)."""
        try:
            self.submit(self._outbox_drained()).result(timeout)
        except Exception:  # best effort, like the events themselves
            pass

    # --- cancels ----------------------------------------------------------------------------

    def watch_cancel(self, key: str, abort: Callable[[], None]) -> Callable[[], None]:
        """Call ``abort`` (on the loop) once the Redis key ``key`` exists, set before or after
        this call; returns an unwatch. The key must be set with ``agentops.cancels.abort_signal``,
        which also publishes it: the runtime's one subscription hears it at once. Call from
        the loop."""
        if self._aborts is None:
            self._aborts = AbortWatcher(self.loop, lambda: str(settings.REDIS_URL))
        return self._aborts.watch(key, abort)


@dataclass(frozen=True, slots=True)
class _Batched:
    """An item for ``send``, in the outbox (``Runtime.send_batched_in_order``)."""

    send: Callable[[list[Any]], Coroutine[Any, Any, None]]
    item: Any


def _yield_to_the_loop() -> None:
    """In a database thread as it starts: raise its niceness by ``AGENTOPS_BOOKKEEPING_NICE``
    (Linux schedules each thread on its own), so where the cores are full the loop that times
    every call's cuts gets one before the bookkeeping does. Raising one's niceness needs no
    privilege; the loop and the rest of the process keep theirs."""
    nice = settings.AGENTOPS_BOOKKEEPING_NICE
    if nice and sys.platform.startswith("linux"):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(os.getpriority(os.PRIO_PROCESS, tid) + nice, 19))


_installed: Runtime | None = None


def install(made: Runtime | None) -> None:
    """At a process's entry point: ``made`` (built and started) is the process's runtime;
    None once it stopped."""
    global _installed
    _installed = made


@contextmanager
def serving(made: RuntimeT) -> Iterator[RuntimeT]:
    """At an entry point whose work is one block (a command, a test session, a bench): ``made``
    started and installed as the process's runtime for the block, then stopped."""
    made.start()
    install(made)
    try:
        yield made
    finally:
        made.stop()
        install(None)


def installed() -> Runtime:
    """The runtime the process's entry point built. Only for what is handed nothing (a Celery
    task, a live event sent after a commit, a connection no lifespan served): everything below
    them is handed the runtime, and a request or socket carries it in its scope."""
    if _installed is None:
        raise NoRuntime(
            "no runtime was built in this process: its entry point builds one "
            "(the worker's worker_init, the ASGI lifespan, manage.py, the tests' session fixture)"
        )
    return _installed
