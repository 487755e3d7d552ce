"""Live events over the Channels layer: a turn's websocket, and the operator dashboard.

Dashboard events go to the Channels group ``dashboard`` as ``{"type": "dashboard.event",
"event": {...}}`` through ``dashboard_publish``; ``interfaces.consumers.DashboardConsumer``
forwards the inner event as is. Event types: ``snapshot`` (sent by the consumer on connect and
on request, built by ``interfaces.dashboard``), ``alert.raised`` (``agentops.alerts``, the alert as
``agentops.selectors.alert_json``), ``call.started`` and ``call.ended``
(``calls.events``), ``hold.started`` and ``hold.ended`` (here, for ``waits``).
Producers call one function each; the event goes out once the current transaction commits,
from the runtime's loop, so the caller never waits on Redis.

Sends happen after commit: a client must never see a state the database rolled back.
"""

from __future__ import annotations

import logging
from typing import Any

from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer

from .rows import after_commit
from .runtime import installed
from .text import bound_text

logger = logging.getLogger(__name__)

DASHBOARD_GROUP = "dashboard"
REASON_LIMIT = 300  # a hold's reason as the dashboard shows it


class ChannelLayer(RedisChannelLayer):  # type: ignore[misc]
    """channels_redis's layer, whose group send costs one Redis command when nobody is in the
    group, and whose sends in a batch (``group_send_many``) ask that of all their groups in one
    round trip. Most turns have no websocket open, and a streamed call sends an event per
    delta: channels_redis trims the group and reads its members first, two round trips for each
    event nobody receives (docs/performance.md, "Live events"). A group with members (an open
    dashboard) pays one round trip more than with the stock layer."""

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        assert self.require_valid_group_name(group), "Group name not valid"
        if await self.connection(self.consistent_hash(group)).zcard(self._group_key(group)):
            await super().group_send(group, message)  # trims, reads the members and sends

    async def group_send_many(self, sends: list[tuple[str, dict[str, Any]]]) -> None:
        """Each ``(group, message)`` sent in order to the group's members, if it has any;
        which groups have members is asked once for all of them (one pipelined round trip per
        Redis server, not one per group).
        A send that fails is logged and the others still go (best effort, as every live
        event); when the question fails, the batch is dropped."""
        groups: dict[str, bool] = dict.fromkeys((group for group, _ in sends), False)
        by_server: dict[int, list[str]] = {}
        for group in groups:
            assert self.require_valid_group_name(group), "Group name not valid"
            by_server.setdefault(self.consistent_hash(group), []).append(group)
        for index, asked in by_server.items():
            pipe = self.connection(index).pipeline(transaction=False)
            for group in asked:
                pipe.zcard(self._group_key(group))
            for group, members in zip(asked, await pipe.execute(), strict=True):
                groups[group] = bool(members)
        for group, message in sends:
            if groups[group]:
                try:
                    await super().group_send(group, message)
                except Exception:
                    logger.warning(
                        "could not send %s to the live group %s",
                        _event_type(message),
                        group,
                        exc_info=True,
                    )


def _event_type(message: dict[str, Any]) -> Any:
    event = message.get("event")
    return event.get("type") if isinstance(event, dict) else message.get("type")


def turn_group(turn_id: int) -> str:
    return f"turn-{turn_id}"


async def _group_sends(sends: list[tuple[str, dict[str, Any]]]) -> None:
    """The live events handed to the runtime's loop one after another, in one batch."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        if isinstance(layer, ChannelLayer):
            await layer.group_send_many(sends)
        else:
            for group, message in sends:
                await layer.group_send(group, message)
    except Exception:  # a live view is best effort; the database is the record
        logger.warning(
            "could not send %d live events (first: %s)",
            len(sends),
            _event_type(sends[0][1]),
            exc_info=True,
        )


def publish_turn_event(turn_id: int, event: dict[str, Any]) -> None:
    """Send ``event`` to the turn's websocket listeners now, in order with this process's other
    live events, on its runtime's loop. Callable from any thread; the caller never waits."""
    _send((turn_group(turn_id), {"type": "turn.event", "event": event}))


def broadcast_turn_event(turn_id: int, event: dict[str, Any]) -> None:
    """Publish ``event`` once the current transaction commits (at once outside one)."""
    after_commit(lambda: publish_turn_event(turn_id, event))


def dashboard_publish(event: dict[str, Any]) -> None:
    """Send ``event`` to every open dashboard (the module docstring lists the event types)
    once the current transaction commits (at once outside one), in order with this process's
    other live events. Never blocks the caller; the one sender of the ``dashboard`` group."""
    after_commit(lambda: _send((DASHBOARD_GROUP, {"type": "dashboard.event", "event": event})))


def _send(item: tuple[str, dict[str, Any]]) -> None:
    # Events are sent from every floor's writes, in any thread, often after a commit: nothing
    # hands them the runtime, so they go out through the process's own (its outbox keeps
    # their order).
    installed().send_batched_in_order(_group_sends, item)


# --- holds (architecture.md §6) -------------------------------------------------------------------


def hold_out(
    *,
    agent: str,
    model: str,
    until_ms: float | None,
    reason: str,
    set_at_ms: float | None,
    source: str,
) -> dict[str, Any]:
    """A binding wait as the dashboard shows it (its events and its snapshot)."""
    return {
        "agent": agent,
        "model": model,
        "until_ms": until_ms,
        "reason": bound_text(reason, REASON_LIMIT),
        "set_at_ms": set_at_ms,
        "source": source,
    }


def dashboard_hold_started(
    *, agent: str, model: str, until_ms: float | None, reason: str, set_at_ms: float, source: str
) -> None:
    """``hold.started``: a wait now binds (agent, model), until ``until_ms`` (None: until
    released). A longer wait replacing a shorter one is a new start for the same pair."""
    dashboard_publish(
        {
            "type": "hold.started",
            "hold": hold_out(
                agent=agent,
                model=model,
                until_ms=until_ms,
                reason=reason,
                set_at_ms=set_at_ms,
                source=source,
            ),
        }
    )


def dashboard_hold_ended(*, agent: str, model: str, why: str) -> None:
    """``hold.ended``: an operator released the wait. (A hold that simply runs out is ended by
    the page itself at its ``until_ms``.)"""
    dashboard_publish(
        {
            "type": "hold.ended",
            "hold": {"agent": agent, "model": model, "why": bound_text(why, REASON_LIMIT)},
        }
    )
