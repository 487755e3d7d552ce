"""A flush of many calls' progress must not hold the loop that times the cuts: it goes out in
slices, the loop's other callbacks run between them, and the more calls are in flight the less
often it goes out."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import redis
from django.conf import settings

from agentops.runtime import Runtime
from calls.client import Timeline
from calls.progress import PER_CALL_S, PROGRESS_KEY, SLICE, ProgressHub, progress_entry


def _hub_on_this_loop() -> ProgressHub:
    """A hub whose runtime is the test's own loop (not started: its sends go on this loop)."""
    here = Runtime(worker=False)
    here.loop = asyncio.get_running_loop()
    return ProgressHub(here)


def _entry(call_id: int) -> dict[str, Any]:
    return progress_entry(
        call_id=call_id,
        agent="a",
        turn_id=None,
        timeline=Timeline(sent=1.0, keepalives=1),
        deadline=None,
    )


async def test_a_flush_of_many_calls_lets_the_loop_run_between_its_slices_and_stores_every_call() -> (
    None
):
    ids = [9_000_000 + i for i in range(3 * SLICE + 7)]
    fields = [str(i) for i in ids]
    store = redis.Redis.from_url(settings.REDIS_URL)
    store.hdel(PROGRESS_KEY, *fields)
    stored_while_flushing: list[int] = []
    flushing = True

    async def meanwhile() -> None:  # another callback on the same loop, as a cut's timer is
        while flushing:
            stored_while_flushing.append(
                sum(v is not None for v in store.hmget(PROGRESS_KEY, fields))
            )
            await asyncio.sleep(0)

    watcher = asyncio.create_task(meanwhile())
    try:
        await _hub_on_this_loop()._send([_entry(i) for i in ids], [])
    finally:
        flushing = False
        await watcher
    values = store.hmget(PROGRESS_KEY, fields)
    assert [json.loads(v)["id"] for v in values if v is not None] == ids
    # The loop ran between slices: it saw some slices stored and not yet the rest.
    assert any(0 < n < len(ids) for n in stored_while_flushing), stored_while_flushing

    await _hub_on_this_loop()._send([], ids)  # ended: dropped, in slices too
    assert store.hmget(PROGRESS_KEY, fields) == [None] * len(ids)


class _Call:
    """A call in flight as the hub reads it (``ProgressSource``)."""

    def __init__(self, call_id: int) -> None:
        self.call_id, self.keepalives = call_id, 1

    def progress(self) -> dict[str, Any]:
        timeline = Timeline(sent=1.0, keepalives=self.keepalives)
        return progress_entry(
            call_id=self.call_id, agent="a", turn_id=None, timeline=timeline, deadline=None
        )


async def _stored_keepalives(
    store: redis.Redis, call_id: int, *, wanted: int, within_s: float
) -> float:
    """Seconds until the stored entry of ``call_id`` shows ``wanted`` keepalives (fails past
    ``within_s``)."""
    started = time.monotonic()
    while time.monotonic() - started < within_s:
        raw = store.hget(PROGRESS_KEY, str(call_id))
        if raw is not None and json.loads(raw)["keepalives"] == wanted:
            return time.monotonic() - started
        await asyncio.sleep(0.02)
    raise AssertionError(
        f"call {call_id}'s progress did not show {wanted} keepalives within {within_s} s"
    )


async def test_the_more_calls_in_flight_the_less_often_their_progress_goes_out() -> None:
    store = redis.Redis.from_url(settings.REDIS_URL)
    hub = _hub_on_this_loop()
    calls = [
        _Call(9_100_000 + i) for i in range(1000)
    ]  # in flight: one flush every 1000 * PER_CALL_S
    first = calls[0]
    for call in calls:
        hub.update(call.call_id, call, urgent=False)
    try:
        await _stored_keepalives(
            store, first.call_id, wanted=1, within_s=5
        )  # nothing went out before: at once
        first.keepalives = 2
        hub.update(first.call_id, first, urgent=False)
        took = await _stored_keepalives(store, first.call_id, wanted=2, within_s=10)
        assert took >= 1000 * PER_CALL_S - 0.2, took
        # Calls that ended no longer count: with ten left, the setting's interval again.
        for call in calls[10:]:
            hub.ended(call.call_id)
        await asyncio.sleep(1000 * PER_CALL_S)
        first.keepalives = 3
        hub.update(first.call_id, first, urgent=False)
        took = await _stored_keepalives(store, first.call_id, wanted=3, within_s=5)
        assert took < settings.AGENTOPS_PROGRESS_INTERVAL_MS / 1000 + 0.5, took
    finally:
        store.hdel(PROGRESS_KEY, *[str(c.call_id) for c in calls])
