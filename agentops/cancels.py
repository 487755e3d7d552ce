"""Abort signals pushed to the calls they abort: a Redis key, set and published at once.

Whoever cancels a running thing (a turn's cancel, a probe's withdrawal) calls ``abort_signal``:
it sets the key (for an hour) and publishes its name on the process-wide abort channel of the
same Redis database, in one transaction. A process that holds calls watches that channel with
one subscription (``AbortWatcher``), so a cancel reaches its call as soon as Redis passes it on,
and a process holding ten thousand calls costs nothing between cancels; it used to fetch every
watched key four times a second.

Pub/sub forgets what it sent while a subscriber was away, so the key is the truth and the
message only the doorbell: each watched key is read once after the subscription is confirmed
(a key set before the watch started aborts at once), every key is read again after each
(re)subscription (a cancel sent across a reconnect or a Redis restart still lands), and a slow
sweep reads them all every ``SWEEP_S`` in case a message was lost in a way nobody saw.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import redis
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

logger = logging.getLogger(__name__)

# The slow fallback: every watched key is read this often, whatever the channel says.
SWEEP_S = 5.0
# How long the watcher waits before subscribing again after Redis went away.
RECONNECT_S = 0.5
# Keys per MGET in a sweep: one round trip per thousand calls, not one huge reply.
SWEEP_BATCH = 1000
# A newly watched key is read after this long, with the others watched meanwhile: a worker
# starting calls by the hundred a second reads them a few dozen at a time, not one round trip
# each. (Only a key set before its watch began waits for this read; later ones are heard.)
READ_GATHER_S = 0.05


def abort_channel(url: str) -> str:
    """The channel aborts for the Redis database at ``url`` are published on. Pub/sub ignores
    the database number, so it is part of the name: a cancel in one database never reaches a
    process watching another."""
    db = redis.connection.parse_url(url).get("db", 0)
    return f"agentops:aborts:{db}"


def abort_signal(url: str, key: str, *, ttl_s: int = 3600) -> None:
    """Set ``key`` and publish it on the abort channel, in one transaction. Raises
    ``redis.RedisError`` if Redis does not take it (the caller decides what a lost signal costs)."""
    client = redis.Redis.from_url(url)
    try:
        pipe = client.pipeline(transaction=True)
        pipe.set(key, "1", ex=ttl_s)
        pipe.publish(abort_channel(url), key)
        pipe.execute()
    finally:
        client.close()


class AbortWatcher:
    """Calls each watched key's callback, once, on the loop, when the key is set. Every method
    runs on the loop that owns the watcher (no locks: nothing between two awaits interleaves)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, url: Callable[[], str]) -> None:
        self._loop = loop
        self._url = url  # read when the watcher starts: settings may change between tests
        self._watched: dict[str, Callable[[], None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._client: redis.asyncio.Redis | None = None
        # True only while the subscription is confirmed: a key watched meanwhile is read at once;
        # one watched otherwise is read when the subscription is (re)confirmed.
        self._subscribed = False
        self._unread: set[str] = set()
        self._reader: asyncio.Task[None] | None = None

    def watch(self, key: str, abort: Callable[[], None]) -> Callable[[], None]:
        """Call ``abort`` once ``key`` exists (now or later); returns an unwatch."""
        self._watched[key] = abort
        if self._task is None or self._task.done():
            self._task = self._loop.create_task(self._run())
        elif self._subscribed:
            self._read_soon({key})

        def unwatch() -> None:
            self._watched.pop(key, None)
            self._unread.discard(key)

        return unwatch

    async def aclose(self) -> None:
        """Stop watching everything and close the connection (a process that ends its loop)."""
        self._watched.clear()
        for task in (self._reader, self._task):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _fire(self, key: str) -> None:
        if (abort := self._watched.pop(key, None)) is not None:
            self._unread.discard(key)
            abort()

    def _read_soon(self, keys: set[str]) -> None:
        """Read ``keys`` on the command connection, batched with any others watched meanwhile."""
        self._unread |= keys
        if self._reader is None or self._reader.done():
            self._reader = self._loop.create_task(self._read_unread())

    async def _read_unread(self) -> None:
        await asyncio.sleep(READ_GATHER_S)
        while self._unread and self._client is not None:
            keys = list(self._unread)
            self._unread.clear()
            await self._read(self._client, keys)

    async def _read(
        self, client: redis.asyncio.Redis, keys: list[str], *, strict: bool = False
    ) -> None:
        """Fire the callbacks of the ``keys`` that are set. With ``strict``, a failed read raises
        (the subscription is begun again, and the keys read again), else it is left to the sweep."""
        for start in range(0, len(keys), SWEEP_BATCH):
            batch = keys[start : start + SWEEP_BATCH]
            try:
                values = await client.mget(batch)
            except (redis.RedisError, OSError):
                if strict:
                    raise
                return  # the next (re)subscription or sweep reads them again
            for key, value in zip(batch, values, strict=True):
                if value is not None:
                    self._fire(key)

    async def _run(self) -> None:
        url = self._url()
        # One immediate retry: after a Redis restart the pooled command connection is dead,
        # and the read that follows the new subscription would fail on it.
        client = self._client = redis.asyncio.Redis.from_url(
            url,
            health_check_interval=SWEEP_S,
            retry=Retry(NoBackoff(), 1),
        )
        try:
            # Checked after every await: a key watched while a subscription closes keeps it going.
            while self._watched:
                try:
                    await self._listen(client, abort_channel(url))
                except (redis.RedisError, OSError):
                    logger.warning(
                        "could not watch for cancels on Redis; subscribing again in %s s",
                        RECONNECT_S,
                        exc_info=True,
                    )
                    await asyncio.sleep(RECONNECT_S)
        finally:
            # Before the await below: a key watched while this watcher closes its connection
            # starts a new watcher instead of waiting on one that has stopped listening.
            if self._task is asyncio.current_task():
                self._task = None
            self._subscribed = False
            if self._client is client:
                self._client = None
            await client.aclose()

    async def _listen(self, client: redis.asyncio.Redis, channel: str) -> None:
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(channel)
            sweep_at = self._loop.time() + SWEEP_S
            while self._watched:
                message = await pubsub.get_message(timeout=max(0.0, sweep_at - self._loop.time()))
                if message is not None and message["type"] == "subscribe":
                    # Confirmed (again, if redis-py reconnected underneath): from now on no
                    # cancel is missed, so read every key watched before.
                    self._subscribed = True
                    self._unread.clear()
                    await self._read(client, list(self._watched), strict=True)
                    sweep_at = self._loop.time() + SWEEP_S
                elif message is not None and message["type"] == "message":
                    data = message["data"]
                    self._fire(data.decode() if isinstance(data, bytes) else str(data))
                if self._loop.time() >= sweep_at:
                    await self._read(client, list(self._watched))
                    sweep_at = self._loop.time() + SWEEP_S
        finally:
            self._subscribed = False
            await pubsub.aclose()
