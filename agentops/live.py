"""Live events over the Channels layer (websockets for turns, the dashboard).

Sends happen after commit: a client must never see a state the database rolled back.
"""

from __future__ import annotations

import logging
from typing import Any

from channels.layers import get_channel_layer
from django.db import transaction

from .background import background_loop

logger = logging.getLogger(__name__)

DASHBOARD_GROUP = "dashboard"


def turn_group(turn_id: int) -> str:
    return f"turn-{turn_id}"


async def _send_turn_event(turn_id: int, event: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(turn_group(turn_id), {"type": "turn.event", "event": event})
    except Exception:  # a live view is best effort; the database is the record
        logger.warning("could not broadcast %s for turn %s", event.get("type"), turn_id, exc_info=True)


def publish_turn_event(turn_id: int, event: dict[str, Any]) -> None:
    """Send ``event`` to the turn's websocket listeners now, in order with this process's other
    live events, on its background loop. Callable from any thread; the caller never waits."""
    background_loop().send_in_order(_send_turn_event(turn_id, event))


def broadcast_turn_event(turn_id: int, event: dict[str, Any]) -> None:
    """Publish ``event`` once the current transaction commits."""
    transaction.on_commit(lambda: publish_turn_event(turn_id, event))


async def _send_dashboard_event(event: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(DASHBOARD_GROUP, {"type": "dashboard.event", "event": event})
    except Exception:  # the dashboard is best effort; the rows are the record
        logger.warning("could not send %s to the dashboard", event.get("type"), exc_info=True)


def dashboard_publish(event: dict[str, Any]) -> None:
    """Send ``event`` to every open dashboard (``agentops.dashboard`` lists the event types)
    once the current transaction commits (at once outside one), in order with this process's
    other live events. Never blocks the caller; the one sender of the ``dashboard`` group."""
    def send() -> None:
        background_loop().send_in_order(_send_dashboard_event(event))

    if transaction.get_connection().in_atomic_block:
        transaction.on_commit(send)
    else:
        # Autocommit: what the caller wrote is committed. (``on_commit`` would open a
        # connection to ask, and a wait recorded while the database is down must still bind.)
        send()
