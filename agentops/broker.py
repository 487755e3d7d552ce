"""The Celery broker's transport: kombu's Redis transport, whose channels keep one client.

kombu's Redis channel builds a new ``redis.Redis`` for every publish, and for each message's
acknowledgement bookkeeping (its place among the unacknowledged, taken and given back), for a
client that only wraps the channel's connection pool (redis-py builds its table of response
callbacks anew with each one): a worker paid it twice per task and the web app once per submit
(docs/performance.md, "The broker's client kept"). The client is thread-safe (each command takes
a connection from the pool), so a channel keeps one for as long as it keeps that pool.

Selected by ``CELERY_BROKER_TRANSPORT``; the broker URL stays a ``redis://`` one.
"""

from __future__ import annotations

from typing import Any

import redis
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    _kept_client: redis.Redis | None = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[misc]
        kept = self._kept_client
        if kept is None or kept.connection_pool is not self.pool:  # a pool made again after a close
            kept = self._kept_client = super()._create_client()  # type: ignore[misc]
        return kept


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel
