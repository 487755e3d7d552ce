"""Abort signals pushed to the calls they abort (``agentops.cancels``), against real Redis: a
cancel arrives within a short bound, a key set before its watch aborts too, a watch begun while
the watcher winds down still works, and a Redis restart does not lose a cancel.

The watcher runs on this test's own event loop; the signal is sent from a thread, as the API
and the breaker send it."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
import redis.asyncio
from django.conf import settings

from agentops.cancels import SWEEP_S, AbortWatcher, abort_channel, abort_signal
from devtools.embedded.redis_server import start_redis

# Far below the old poll interval (250 ms) and the sweep (5 s): only the push meets it.
PUSHED_WITHIN_S = 0.15


def a_key() -> str:
    return f"agentops:test-abort:{uuid.uuid4()}"


class Fired:
    """An abort callback that notes when it ran."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.times = 0
        self.event = asyncio.Event()

    def __call__(self) -> None:
        self.at = time.monotonic()
        self.times += 1
        self.event.set()

    async def within(self, seconds: float) -> bool:
        try:
            await asyncio.wait_for(self.event.wait(), seconds)
        except TimeoutError:
            return False
        return True


async def subscribed(watcher: AbortWatcher) -> None:
    """Until the watcher's subscription is confirmed (its first read done)."""
    deadline = time.monotonic() + 5
    while not watcher._subscribed:
        assert time.monotonic() < deadline, "the watcher never subscribed"
        await asyncio.sleep(0.005)


@pytest.fixture
async def watcher() -> AsyncIterator[AbortWatcher]:
    watching = AbortWatcher(asyncio.get_running_loop(), lambda: settings.REDIS_URL)
    yield watching
    await watching.aclose()


async def test_a_cancel_reaches_its_watch_within_a_fraction_of_the_old_poll_interval(
    watcher: AbortWatcher,
) -> None:
    others = [watcher.watch(a_key(), Fired()) for _ in range(200)]  # a busy process
    latencies = []
    for _ in range(10):
        key, fired = a_key(), Fired()
        watcher.watch(key, fired)
        await subscribed(watcher)
        await asyncio.sleep(0.03)  # not in step with anything the watcher does
        sent = time.monotonic()
        await asyncio.to_thread(abort_signal, settings.REDIS_URL, key)
        assert await fired.within(2), "the cancel never arrived"
        assert fired.at is not None
        latencies.append(fired.at - sent)
    for unwatch in others:
        unwatch()
    assert max(latencies) < PUSHED_WITHIN_S, [round(s * 1000, 1) for s in latencies]


async def test_a_cancel_set_before_its_watch_began_aborts_at_once(watcher: AbortWatcher) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        # Before the watcher exists, and while it is subscribed: a plain SET, no message at all.
        early = a_key()
        client.set(early, "1", ex=60)
        fired_early = Fired()
        watcher.watch(early, fired_early)
        assert await fired_early.within(PUSHED_WITHIN_S * 4)
        keep = watcher.watch(a_key(), Fired())
        await subscribed(watcher)
        late = a_key()
        client.set(late, "1", ex=60)
        fired_late = Fired()
        started = time.monotonic()
        watcher.watch(late, fired_late)
        assert await fired_late.within(1)
        assert fired_late.at is not None and fired_late.at - started < PUSHED_WITHIN_S
        keep()
    finally:
        client.close()
    assert fired_early.times == 1 and fired_late.times == 1


async def test_keys_watched_one_after_another_are_read_together(
    watcher: AbortWatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    keep = watcher.watch(a_key(), Fired())
    await subscribed(watcher)
    reads: list[int] = []
    mget = redis.asyncio.Redis.mget

    async def counted(self: redis.asyncio.Redis, keys: list[str]) -> object:
        reads.append(len(keys))
        return await mget(self, keys)

    monkeypatch.setattr(redis.asyncio.Redis, "mget", counted)
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        keys = [a_key() for _ in range(30)]
        for key in keys[::3]:
            client.set(key, "1", ex=60)  # set before their watches began: only the read finds them
        fired = {key: Fired() for key in keys}
        for key in keys:  # a worker starting calls: a watch each
            watcher.watch(key, fired[key])
            await asyncio.sleep(0.001)
        for key in keys[::3]:
            assert await fired[key].within(1)
    finally:
        client.close()
        keep()
    assert reads == [30], reads  # one round trip for all, not one a call
    assert [key for key in keys if fired[key].times] == keys[::3]


async def test_an_unwatched_key_is_not_aborted_and_a_watch_fires_once(
    watcher: AbortWatcher,
) -> None:
    gone, kept = a_key(), a_key()
    fired_gone, fired_kept = Fired(), Fired()
    unwatch = watcher.watch(gone, fired_gone)
    watcher.watch(kept, fired_kept)
    await subscribed(watcher)
    unwatch()
    await asyncio.to_thread(abort_signal, settings.REDIS_URL, gone)
    await asyncio.to_thread(abort_signal, settings.REDIS_URL, kept)
    await asyncio.to_thread(abort_signal, settings.REDIS_URL, kept)
    assert await fired_kept.within(2)
    await asyncio.sleep(
        0.1
    )  # a chance for the unwatched key or a second signal to fire (the kept one fired within ms)
    assert fired_gone.times == 0 and fired_kept.times == 1


async def test_a_watch_begun_while_the_watcher_winds_down_still_aborts(
    watcher: AbortWatcher,
) -> None:
    for attempt in range(15):
        first = watcher.watch(a_key(), Fired())
        await subscribed(watcher)
        first()  # nothing watched: the next message the watcher reads ends its subscription
        await asyncio.to_thread(abort_signal, settings.REDIS_URL, a_key())
        await asyncio.sleep(attempt * 0.001)  # a different point of the wind-down each time
        key, fired = a_key(), Fired()
        watcher.watch(key, fired)
        await asyncio.to_thread(abort_signal, settings.REDIS_URL, key)
        assert await fired.within(SWEEP_S / 2), (
            f"attempt {attempt}: a watch begun during the wind-down was lost"
        )


def test_the_abort_channel_names_the_database() -> None:
    assert abort_channel("redis://127.0.0.1:6379/8") == "agentops:aborts:8"
    assert abort_channel("redis://127.0.0.1:6379") == "agentops:aborts:0"


@pytest.fixture
def throwaway_redis() -> Iterator[tuple[Path, list[object]]]:
    var = Path(tempfile.mkdtemp(prefix="agentops-cancels-"))
    servers: list[object] = [start_redis(var)]
    try:
        yield var, servers
    finally:
        servers[-1].stop()  # type: ignore[attr-defined]
        shutil.rmtree(var, ignore_errors=True)


async def test_a_cancel_sent_while_the_watcher_reconnects_after_a_redis_restart_still_aborts(
    throwaway_redis: tuple[Path, list[object]],
) -> None:
    var, servers = throwaway_redis
    url = servers[-1].url  # type: ignore[attr-defined]
    watcher = AbortWatcher(asyncio.get_running_loop(), lambda: url)
    try:
        await a_restart_loses_no_cancel(watcher, var, servers, url)
    finally:
        await watcher.aclose()


async def a_restart_loses_no_cancel(
    watcher: AbortWatcher, var: Path, servers: list[object], url: str
) -> None:
    key, fired = a_key(), Fired()
    watcher.watch(key, fired)
    await subscribed(watcher)
    await asyncio.to_thread(servers[-1].stop)  # type: ignore[attr-defined]
    servers.append(await asyncio.to_thread(start_redis, var))
    assert servers[-1].url == url  # type: ignore[attr-defined]
    # At once, before the watcher has subscribed again: nobody hears the message, only the key
    # stays.
    await asyncio.to_thread(abort_signal, url, key)
    assert await fired.within(SWEEP_S / 2), "the cancel sent across the restart was lost"
    # And the watcher listens again afterwards.
    again, fired_again = a_key(), Fired()
    watcher.watch(again, fired_again)
    await subscribed(watcher)
    await asyncio.to_thread(abort_signal, url, again)
    assert await fired_again.within(1)
