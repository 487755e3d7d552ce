"""A flush of many calls' progress must not hold the loop that times the cuts: it goes out in
slices, and the loop's other callbacks run between them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis
from django.conf import settings

from calls.client import Timeline
from calls.progress import PROGRESS_KEY, SLICE, ProgressHub, progress_entry


def _entry(call_id: int) -> dict[str, Any]:
    return progress_entry(call_id=call_id, agent="a", turn_id=None, timeline=Timeline(sent=1.0, keepalives=1), deadline=None)


async def test_a_flush_of_many_calls_lets_the_loop_run_between_its_slices_and_stores_every_call() -> None:
    ids = [9_000_000 + i for i in range(3 * SLICE + 7)]
    fields = [str(i) for i in ids]
    store = redis.Redis.from_url(settings.REDIS_URL)
    store.hdel(PROGRESS_KEY, *fields)
    stored_while_flushing: list[int] = []
    flushing = True

    async def meanwhile() -> None:  # another callback on the same loop, as a cut's timer is
        while flushing:
            stored_while_flushing.append(sum(v is not None for v in store.hmget(PROGRESS_KEY, fields)))
            await asyncio.sleep(0)

    watcher = asyncio.create_task(meanwhile())
    try:
        await ProgressHub(asyncio.get_running_loop())._send([_entry(i) for i in ids], [])
    finally:
        flushing = False
        await watcher
    values = store.hmget(PROGRESS_KEY, fields)
    assert [json.loads(v)["id"] for v in values if v is not None] == ids
    # The loop ran between slices: it saw some slices stored and not yet the rest.
    assert any(0 < n < len(ids) for n in stored_while_flushing), stored_while_flushing

    await ProgressHub(asyncio.get_running_loop())._send([], ids)  # ended: dropped, in slices too
    assert store.hmget(PROGRESS_KEY, fields) == [None] * len(ids)
