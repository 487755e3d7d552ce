"""Live progress of in-flight calls (architecture.md §9): first event, first content, model-event
and keepalive counts, and the nearest deadline with its bound, as the call is read.

``perform_call`` reports each item it applies (``on_progress``); the process's one
``ProgressHub`` keeps the latest state per call and, at most every
``AGENTOPS_PROGRESS_INTERVAL_MS`` (sooner for a call's first event and first content), sends one
``call.progress`` event to the dashboard with every call that changed, and stores the same
entries in one Redis hash that ``GET /turns/{id}`` reads for a call in flight. So a thousand
streams cost a few messages a second, not one per model event.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Final, Protocol

import redis
import redis.asyncio
from django.conf import settings

from agentops.live import DASHBOARD_GROUP
from agentops.runtime import Runtime
from calls.bounds import Deadline
from calls.client import Timeline

logger = logging.getLogger(__name__)

PROGRESS_KEY: Final = "agentops:call-progress"
PROGRESS_TTL_S: Final = 3600  # the hash goes once no process has written it for this long
URGENT_GAP_S: Final = 0.05  # first events and first content: out within this
# Each flush costs the process CPU for every call in it (its entry encoded and stored): with
# many calls in flight the interval stretches by this much per call, so the flush stays a small
# share of what reading the streams costs (docs/performance.md, "Live events").
PER_CALL_S: Final = 0.002
# A flush goes out this many calls at a time, each slice its own round trip (the loop runs its
# timers while it waits for the answer): encoding thousands of calls at once stalled it
# (docs/performance.md, "Live events").
SLICE: Final = 250


def progress_entry(
    *, call_id: int, agent: str, turn_id: int | None, timeline: Timeline, deadline: Deadline | None
) -> dict[str, Any]:
    """One call's progress as the dashboard and ``GET /turns/{id}`` read it (instants in ms)."""
    return {
        "id": call_id,
        "agent": agent,
        "turn": turn_id,
        "first_event_ms": timeline.first_event,
        "first_content_ms": timeline.first_content,
        "last_event_ms": timeline.last_event,
        "model_events": timeline.model_events,
        "keepalives": timeline.keepalives,
        "deadline_ms": deadline.at if deadline is not None else None,
        "bound": deadline.bound.value if deadline is not None else None,
    }


class ProgressSource(Protocol):
    """A call in flight as the hub reads it when it flushes (not at each event: a keepalive
    costs a dictionary store, not an entry built)."""

    def progress(self) -> dict[str, Any]: ...


class ProgressHub:
    """The process's progress sender, a part of its runtime (every method runs on its loop)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.loop = runtime.loop
        self._pending: dict[int, ProgressSource] = {}
        self._ended: set[int] = set()
        self._in_flight: set[int] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._last = 0.0
        self._redis: redis.asyncio.Redis | None = None

    def _interval(self) -> float:
        return max(settings.AGENTOPS_PROGRESS_INTERVAL_MS / 1000, len(self._in_flight) * PER_CALL_S)

    def update(self, call_id: int, source: ProgressSource, *, urgent: bool) -> None:
        self._pending[call_id] = source
        self._in_flight.add(call_id)
        self._schedule(self._last + (URGENT_GAP_S if urgent else self._interval()))

    def ended(self, call_id: int) -> None:
        """The call is over (its row has the final counts): forget it, and drop its entry."""
        self._pending.pop(call_id, None)
        self._in_flight.discard(call_id)
        self._ended.add(call_id)
        self._schedule(self._last + self._interval())

    def _schedule(self, due: float) -> None:
        due = max(due, self.loop.time())
        if self._timer is not None and self._due <= due:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._due = due
        self._timer = self.loop.call_at(due, self._flush)

    def _flush(self) -> None:
        self._timer = None
        self._last = self.loop.time()
        batch, self._pending = [source.progress() for source in self._pending.values()], {}
        ended, self._ended = list(self._ended), set()
        if batch or ended:
            self.runtime.send_in_order(self._send(batch, ended))

    async def _send(self, batch: list[dict[str, Any]], ended: list[int]) -> None:
        for start in range(0, max(len(batch), len(ended)), SLICE):
            await self._send_slice(batch[start : start + SLICE], ended[start : start + SLICE])

    async def _send_slice(self, batch: list[dict[str, Any]], ended: list[int]) -> None:
        try:
            if self._redis is None:
                self._redis = redis.asyncio.Redis.from_url(settings.REDIS_URL)
            pipe = self._redis.pipeline(transaction=False)
            if batch:
                pipe.hset(PROGRESS_KEY, mapping={str(e["id"]): json.dumps(e) for e in batch})
                pipe.expire(PROGRESS_KEY, PROGRESS_TTL_S)
            if ended:
                pipe.hdel(PROGRESS_KEY, *[str(i) for i in ended])
            await pipe.execute()
        except redis.RedisError:  # a live view is best effort; the call's row is the record
            logger.warning("could not store the progress of %d calls", len(batch), exc_info=True)
        if batch:
            from channels.layers import get_channel_layer

            layer = get_channel_layer()
            if layer is None:
                return
            try:
                await layer.group_send(
                    DASHBOARD_GROUP,
                    {"type": "dashboard.event", "event": {"type": "call.progress", "calls": batch}},
                )
            except Exception:  # best effort, as every dashboard event
                logger.warning("could not send call.progress to the dashboard", exc_info=True)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._redis is not None:
            await self._redis.aclose()


def call_progress_read(call_ids: list[int]) -> dict[int, dict[str, Any]]:
    """The stored progress of these in-flight calls, by id (calls with none are left out)."""
    if not call_ids:
        return {}
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1)
    try:
        values = client.hmget(PROGRESS_KEY, [str(i) for i in call_ids])
    except redis.RedisError:
        return {}
    finally:
        client.close()
    out: dict[int, dict[str, Any]] = {}
    for call_id, raw in zip(call_ids, values, strict=True):
        if raw is None:
            continue
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out[call_id] = entry
    return out
