"""A process's bounded memory of recent values: the one map type for what a process keeps
to spare a query or a log line (a token's last write, a hold already logged, tokens and agents
found, an agent's budget holds read). cachetools' ``TTLCache`` bounds it by size (least
recently used out first) and by age; a lock makes it safe from the runtime's database
threads and the loop alike."""

from __future__ import annotations

import threading
from typing import Generic, TypeVar

from cachetools import TTLCache

K = TypeVar("K")
V = TypeVar("V")


class Recent(Generic[K, V]):
    """At most ``size`` entries, each forgotten ``ttl_s`` seconds after it was put."""

    def __init__(self, *, size: int, ttl_s: float) -> None:
        self._kept: TTLCache[K, V] = TTLCache(maxsize=size, ttl=ttl_s)
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._kept.get(key)

    def put(self, key: K, value: V) -> None:
        with self._lock:
            self._kept[key] = value

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
