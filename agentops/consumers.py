"""Websocket consumers. ``/ws/turns/{id}?token=...`` streams one turn's live events;
``/ws/dashboard`` feeds the operator dashboard."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from agentops.dashboard import dashboard_snapshot
from agentops.live import DASHBOARD_GROUP, turn_group
from agentops.tokens import api_token_check


class TurnConsumer(AsyncJsonWebsocketConsumer):
    """Sends ``turn.status`` at once, then ``call.started``, ``call.delta``, ``call.ended``,
    ``turn.status`` and ``turn.ended`` as they happen. A bad token or unknown turn closes
    the socket with 4401 / 4404 before it is accepted."""

    group: str | None = None

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode(errors="replace"))
        token = (query.get("token") or [""])[0]
        if await database_sync_to_async(api_token_check)(token) is None:
            await self.close(code=4401)
            return
        try:
            turn_id = int(self.scope["url_route"]["kwargs"]["turn_id"])
        except (KeyError, ValueError):
            await self.close(code=4404)
            return
        status = await database_sync_to_async(_turn_status)(turn_id)
        if status is None:
            await self.close(code=4404)
            return
        self.group = turn_group(turn_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"type": "turn.status", "turn": turn_id, "status": status})

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        return None  # the socket is one-way

    async def turn_event(self, message: dict[str, Any]) -> None:
        await self.send_json(message["event"])


def _turn_status(turn_id: int) -> str | None:
    from inference.models import Turn

    return Turn.objects.filter(pk=turn_id).values_list("status", flat=True).first()


class DashboardConsumer(AsyncJsonWebsocketConsumer):
    """``/ws/dashboard``: the operator dashboard's live feed, for staff users signed in to the
    admin (the session cookie; the route checks the Origin). Sends a ``snapshot`` at once and on
    ``{"type": "snapshot"}``, then every event of the ``dashboard`` group as it happens (see
    agentops.dashboard). Closes with 4401 for an anonymous user, 4403 for one who is not staff.

    The group is joined before the snapshot is read, so no event falls between the two: an
    event may also show in the snapshot, and the page applies events idempotently."""

    joined = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        if not (user.is_active and user.is_staff):
            await self.close(code=4403)
            return
        await self.channel_layer.group_add(DASHBOARD_GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        await self._send_snapshot()

    async def disconnect(self, code: int) -> None:
        if self.joined:
            await self.channel_layer.group_discard(DASHBOARD_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if isinstance(content, dict) and content.get("type") == "snapshot":
            await self._send_snapshot()

    async def dashboard_event(self, message: dict[str, Any]) -> None:
        await self.send_json(message["event"])

    async def _send_snapshot(self) -> None:
        await self.send_json(await database_sync_to_async(_dashboard_snapshot)())


def _dashboard_snapshot() -> dict[str, Any]:
    from waits.clock import clock_ms

    return dashboard_snapshot(now_ms=clock_ms())
