"""The runtime: the live events handed to it in order (``send_in_order``,
``send_batched_in_order``), its database threads (``db``, ``db_durably``) and its warm
shutdown."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

import pytest
from django.db import IntegrityError, OperationalError

from agentops.runtime import LeaseLost, Runtime

# Module-level, as the callers' senders are: a batch is the run of items for one ``send``.
_batches: list[list[str]] = []
_gate = threading.Event()
_out = threading.Event()


async def _record_batch(items: list[str]) -> None:
    _batches.append(items)
    _out.set()
    await asyncio.get_running_loop().run_in_executor(None, _gate.wait, 10)


async def _other_batch(items: list[str]) -> None:
    _batches.append([f"other:{item}" for item in items])


def test_items_handed_while_a_send_is_out_go_together_in_order_and_a_coroutine_keeps_its_place() -> (
    None
):
    engine = _started()
    _batches.clear()
    _gate.clear()
    _out.clear()
    order: list[str] = []

    async def coroutine(name: str) -> None:
        order.append(name)

    engine.send_batched_in_order(_record_batch, "a")
    assert _out.wait(10)  # "a" is out, alone; what comes now waits behind it
    for item in ("b", "c"):
        engine.send_batched_in_order(_record_batch, item)
    engine.send_batched_in_order(_other_batch, "x")
    engine.send_in_order(coroutine("between"))
    for item in ("d", "e"):
        engine.send_batched_in_order(_record_batch, item)
    engine.loop.call_soon_threadsafe(_gate.set)
    engine.flush(10)
    assert _batches == [["a"], ["b", "c"], ["other:x"], ["d", "e"]]
    assert order == ["between"]

    async def from_the_loop() -> None:  # no wake-up needed on the loop's own thread
        engine.send_batched_in_order(_other_batch, "y")
        engine.send_batched_in_order(_other_batch, "z")

    engine.submit(from_the_loop()).result(10)
    engine.flush(10)
    assert _batches[-1] == ["other:y", "other:z"]


def test_items_handed_over_within_a_few_milliseconds_go_in_one_batch() -> None:
    engine = _started()
    _batches.clear()

    async def handed() -> None:
        for item in ("a", "b", "c"):
            engine.send_batched_in_order(_other_batch, item)
            await asyncio.sleep(0)  # the loop turns between them: the sender could have run

    engine.submit(handed()).result(10)
    engine.flush(10)
    assert _batches == [["other:a", "other:b", "other:c"]]


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


async def _niceness_on_loop() -> int:
    return _niceness()


def test_the_bookkeeping_threads_yield_the_cpu_to_the_loop_that_times_the_cuts(
    settings: Any,
) -> None:
    """Where the cores are busy, the thread that runs every call's timers must get one first:
    the bookkeeping threads run at a lower priority (their niceness raised), the loop at the
    process's own."""
    settings.AGENTOPS_BOOKKEEPING_NICE = 7
    engine = _started()
    own = _niceness()
    assert own < 19, (
        "the suite runs at the lowest priority already: nothing to lower, nothing tested"
    )
    assert engine.pool.submit(_niceness).result(timeout=5) == min(own + 7, 19)
    assert (
        asyncio.run_coroutine_threadsafe(_niceness_on_loop(), engine.loop).result(timeout=5) == own
    )
    assert _niceness() == own  # the calling thread, and so the process, is untouched


def _started(*, worker: bool = True) -> Runtime:
    engine = Runtime(worker=worker)
    engine.start()
    return engine


def test_db_durably_tries_again_while_the_database_does_not_answer_and_offers_what_waited() -> None:
    engine = _started()
    tries: list[str] = []
    recovered: list[bool] = []

    def write() -> str:
        tries.append(threading.current_thread().name)
        if len(tries) < 3:
            raise OperationalError("the database did not answer")
        return "written"

    done = engine.submit(
        engine.db_durably(write, what="a test write", recovered=lambda: recovered.append(True))
    ).result(10)
    assert done == "written" and len(tries) == 3
    assert all(name.startswith("agentops-db") for name in tries)  # never on the loop's thread
    assert recovered == [True]  # once, after the outage


def test_db_durably_stops_once_what_it_waited_for_is_no_longer_its_own() -> None:
    engine = _started()
    tries: list[int] = []

    def write() -> None:
        tries.append(1)
        raise OperationalError("the database did not answer")

    with pytest.raises(LeaseLost):
        engine.submit(
            engine.db_durably(write, what="a test write", still_ours=lambda: False)
        ).result(10)
    assert len(tries) == 1  # asked after the first failure, and not tried again


def test_a_query_error_is_not_taken_for_an_outage() -> None:
    engine = _started()
    tries: list[int] = []

    def write() -> None:
        tries.append(1)
        raise IntegrityError("a row that breaks a constraint")

    with pytest.raises(IntegrityError):
        engine.submit(engine.db_durably(write, what="a test write")).result(10)
    assert len(tries) == 1


def test_the_warm_shutdown_sets_every_wake_and_waits_for_the_counted_work() -> None:
    engine = _started()
    early, late = threading.Event(), threading.Event()
    engine.wake_on_shutdown(early)
    forgotten = threading.Event()
    engine.wake_on_shutdown(forgotten)()  # undone: not set
    engine.work_started()
    idle = threading.Thread(target=engine.wait_idle)
    idle.start()
    engine.begin_shutdown()
    engine.wake_on_shutdown(late)  # after it began: set at once
    assert early.is_set() and late.is_set() and not forgotten.is_set()
    idle.join(0.2)
    assert idle.is_alive()  # the counted work still runs
    engine.work_ended()
    idle.join(5)
    assert not idle.is_alive()
