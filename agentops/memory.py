"""A process's bounded memory of recent values: the one map type for what a process keeps
to spare a query or a log line (a token's last write, a hold already logged, tokens and agents
found, an agent's budget holds read). cachetools' ``TTLCache`` bounds it by size (least
recently used out first) and by age; a lock makes it safe from the runtime's database
threads and the loop alike."""

from __future__ import annotations

import threading
from collections.abc import Callable
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

    def change(self, key: K, how: Callable[[V | None], V]) -> V:
        """Put ``how(the value kept, or None)`` under ``key`` and return it, as one step: no
        other thread reads or changes that entry in between."""
        with self._lock:
            value = how(self._kept.get(key))
            self._kept[key] = value
            return value

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()
