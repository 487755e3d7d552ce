"""Websocket consumers. ``/ws/turns/{id}?token=...`` streams one turn's live events;
``/ws/dashboard`` feeds the operator dashboard."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import parse_qs

import redis
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from agentops.exceptions import NotFound
from agentops.live import DASHBOARD_GROUP, turn_group
from agentops.models import ApiToken
from agentops.selectors import id_valid
from agentops.tokens import api_token_check
from calls.pacing import Pacer
from inference.models import Turn
from interfaces.dashboard import dashboard_snapshot
from interfaces.edge import runtime_in
from turns.runtime import TurnRuntime


class ToleratesBadFrames(AsyncJsonWebsocketConsumer):
    """A JSON consumer that ignores a frame it cannot read (binary, empty, not JSON, nested too
    deep) instead of letting the error close the socket with 1011 and log a traceback: a client
    can't break its own feed, and a bad frame costs the server nothing but its decode."""

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        if not text_data:
            return
        try:
            content = json.loads(text_data)
        except (ValueError, RecursionError):
            return
        await self.receive_json(content, **kwargs)

    async def refuse(self, code: int) -> None:
        """Close with ``code`` after the handshake: a socket closed before it is accepted reaches
        the client as an HTTP 403, whatever the reason, and the code is lost."""
        await self.accept()
        await self.close(code=code)


class TurnConsumer(ToleratesBadFrames):
    """Sends ``turn.status`` at once, then ``call.started``, ``call.delta``, ``call.ended``,
    ``turn.status`` and ``turn.ended`` as they happen (a cancelled turn's call may end after
    its ``turn.ended``: the client closes the socket). On a turn that has already ended, its
    ``turn.status`` and ``turn.ended`` at once, then the server closes it (1000). A bad token
    or an unknown turn closes the socket with 4401 / 4404 once it is open.

    The turn's group is joined before its status is read, so a turn that ends meanwhile is
    still seen to end; nothing is sent once the server has closed the socket."""

    group: str | None = None
    closed = False  # by the server: nothing more is sent

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode(errors="replace"))
        db = runtime_in(self.scope).db
        token = await db(api_token_check, (query.get("token") or [""])[0])
        if token is None:
            await self.refuse(4401)
            return
        try:
            turn_id = int(self.scope["url_route"]["kwargs"]["turn_id"])
        except (KeyError, ValueError):
            turn_id = 0
        if not id_valid(turn_id):  # no turn has it (and its group's name would be too long)
            await self.refuse(4404)
            return
        self.group = turn_group(turn_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        # Another project's turn is unknown to this token, exactly as a missing one.
        status = await db(_turn_status, turn_id, token)
        if status is None:
            await self.refuse(4404)
            return
        await self.accept()
        await self.send_json({"type": "turn.status", "turn": turn_id, "status": status})
        if status in Turn.ENDED:
            await self.send_json({"type": "turn.ended", "turn": turn_id, "status": status})
            await self.close()

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        return None  # the socket is one-way

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        self.closed = True
        await super().close(code=code, reason=reason)

    async def turn_event(self, message: dict[str, Any]) -> None:
        if not self.closed:  # an event of the group may come between the close and the disconnect
            await self.send_json(message["event"])


def _turn_status(turn_id: int, token: ApiToken) -> str | None:
    from interfaces.selectors import turn_for

    try:
        return str(turn_for(token=token, turn_id=turn_id).status)
    except NotFound:
        return None


class DashboardConsumer(ToleratesBadFrames):
    """``/ws/dashboard``: the operator dashboard's live feed, for staff users signed in to the
    admin (the session cookie; the route checks the Origin). Sends a ``snapshot`` at once and on
    ``{"type": "snapshot"}``, then every event of the ``dashboard`` group as it happens (see
    agentops.live). Closes with 4401 for an anonymous user, 4403 for one who is not staff, once
    the socket is open (so the page can tell the two apart).

    The group is joined before the snapshot is read, so no event falls between the two: an
    event may also show in the snapshot, and the page applies events idempotently.

    What the client sends: a frame that is not JSON text (binary, empty, malformed) is ignored
    and the socket stays open; so is any message other than ``{"type": "snapshot"}``. A snapshot
    reads several tables, so a socket gets at most one per ``SNAPSHOT_INTERVAL_S``: a request
    inside that window is deferred to its end, and requests made while one is deferred are
    dropped (the deferred snapshot answers them all)."""

    SNAPSHOT_INTERVAL_S = 2.0
    # Open dashboard sockets in this process: past AGENTOPS_DASHBOARD_SOCKETS a new one is
    # closed with 4429 before it touches Redis, so the channel layer's pool always has room.
    open_here = 0

    joined = False
    counted = False
    _last_snapshot = -float("inf")  # time.monotonic() of the last snapshot sent
    _deferred: asyncio.Task[None] | None = None
    rt: TurnRuntime

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(4401)
            return
        if not (user.is_active and user.is_staff):
            await self.refuse(4403)
            return
        if DashboardConsumer.open_here >= settings.AGENTOPS_DASHBOARD_SOCKETS:
            await self.refuse(4429)  # too many open here: the page says so and tries again later
            return
        DashboardConsumer.open_here += 1
        self.counted = True
        self.rt = runtime_in(self.scope)  # its snapshots are read through the runtime
        try:
            await self.channel_layer.group_add(DASHBOARD_GROUP, self.channel_name)
        except redis.RedisError:
            await self.refuse(1013)  # Redis does not answer: try again later (never a 500)
            return
        self.joined = True
        await self.accept()
        await self._send_snapshot()

    async def disconnect(self, code: int) -> None:
        if self.counted:
            DashboardConsumer.open_here -= 1
            self.counted = False
        if self._deferred is not None:
            self._deferred.cancel()
        if self.joined:
            try:
                await self.channel_layer.group_discard(DASHBOARD_GROUP, self.channel_name)
            except redis.RedisError:
                pass  # the group's membership expires on its own

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not (isinstance(content, dict) and content.get("type") == "snapshot"):
            return
        if self._deferred is not None:
            return  # one is on its way
        wait = self._last_snapshot + self.SNAPSHOT_INTERVAL_S - time.monotonic()
        if wait <= 0:
            await self._send_snapshot()
        else:
            self._deferred = asyncio.create_task(self._send_snapshot_after(wait))

    async def dashboard_event(self, message: dict[str, Any]) -> None:
        await self.send_json(message["event"])

    async def _send_snapshot_after(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        try:
            await self._send_snapshot()
        finally:
            self._deferred = None

    async def _send_snapshot(self) -> None:
        self._last_snapshot = time.monotonic()
        await self.send_json(await self.rt.db(_dashboard_snapshot, self.rt.pacer))


def _dashboard_snapshot(pacer: Pacer) -> dict[str, Any]:
    from waits.clock import clock_ms

    return dashboard_snapshot(pacer, now_ms=clock_ms())
