"""Live progress of in-flight calls: a receiving stream's counts and its moving deadline reach
the dashboard (``call.progress``) and ``GET /turns/{id}``, a few times a second at most; and an
idle dashboard socket outlives the Redis client's socket timeout without a traceback."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from inference.models import InferenceCall
from tests.conftest import wait_for
from tests.interfaces.test_dashboard import dashboard_socket, staff  # noqa: F401  (a fixture)
from tests.turns.test_websocket import _queued_turn_without_enqueue

pytestmark = [pytest.mark.django_db(transaction=True)]


async def _events_until_ended(ws: Any, call_id: int, *, timeout: float) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        event = await ws.receive_json_from(timeout=max(end - time.monotonic(), 0.1))
        event["_at"] = time.monotonic()
        events.append(event)
        if event["type"] == "call.ended" and event["call"]["id"] == call_id:
            return events
    raise AssertionError("the call did not end in time")


@pytest.mark.usefixtures("workers")
async def test_a_receiving_streams_progress_reaches_the_dashboard_and_moves_its_deadline(
    staff: User,  # noqa: F811
    make_agent: Any,
) -> None:
    agent = await database_sync_to_async(make_agent)(model="answer:chunks=40,interval_ms=60")
    await database_sync_to_async(_queued_turn_without_enqueue)(agent, "hello")
    ws, connected, _ = await dashboard_socket(staff)
    assert connected
    assert (await ws.receive_json_from(timeout=10))["type"] == "snapshot"
    from interfaces.tasks import agent_drain

    await database_sync_to_async(agent_drain.delay)(agent.pk)
    started = await ws.receive_json_from(timeout=20)
    while started["type"] != "call.started":
        started = await ws.receive_json_from(timeout=20)
    call = started["call"]
    assert call["bound"] == "before_content"
    events = await _events_until_ended(ws, call["id"], timeout=30)
    progress = [
        p
        for e in events
        if e["type"] == "call.progress"
        for p in e["calls"]
        if p["id"] == call["id"]
    ]
    assert progress, "no call.progress reached the dashboard"
    content = [p for p in progress if p["first_content_ms"] is not None]
    assert content, progress
    moved = content[-1]
    # Content arrived: the nearest deadline is the between-events one after the last model
    # event, no longer the before-content deadline of the send.
    assert moved["bound"] == "between_events"
    assert moved["deadline_ms"] != call["deadline_ms"]
    assert moved["deadline_ms"] > moved["last_event_ms"]
    assert moved["model_events"] >= 2 and moved["agent"] == agent.name
    counts = [p["model_events"] for p in progress]
    assert counts == sorted(counts)  # in order
    # A few a second at most: 40 model events over ~2.4 s; the first event and first content go
    # out at once, the rest at most every 250 ms.
    span = max(events[-1]["_at"] - events[0]["_at"], 0.25)
    assert len(progress) <= span / 0.25 + 3, (len(progress), span)
    # Nothing about the call after its end (longer than a progress interval).
    after: list[dict[str, Any]] = []
    while not await ws.receive_nothing(timeout=0.8):
        after.append(await ws.receive_json_from(timeout=1))
    assert not any(
        e["type"] == "call.progress" and any(p["id"] == call["id"] for p in e["calls"])
        for e in after
    )
    await ws.disconnect()


@pytest.mark.usefixtures("workers")
def test_get_turn_shows_an_in_flight_calls_live_counts_and_next_deadline(
    api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="answer:chunks=30,interval_ms=300")
    turn = _queued_turn_without_enqueue(agent, "hello")
    from interfaces.tasks import agent_drain

    agent_drain.delay(agent.pk)

    def live_call() -> dict[str, Any] | None:
        calls = api.get(f"/api/v1/turns/{turn.pk}").json()["calls"]
        if calls and calls[0]["ended_at"] is None and calls[0]["model_events"] >= 2:
            return dict(calls[0])
        return None

    call = wait_for(live_call, timeout=30, what="an in-flight call with model events")
    assert call["first_event_at"] is not None and call["first_content_at"] is not None
    assert call["next_bound"] == "between_events" and call["next_deadline"] is not None
    assert call["outcome"] is None
    row = InferenceCall.objects.get(pk=call["id"])
    assert row.model_events == 0  # the row has the final counts only at the end: these are live
    wait_for(
        lambda: api.get(f"/api/v1/turns/{turn.pk}").json()["status"] == "succeeded",
        timeout=30,
        what="the turn to succeed",
    )
    done = api.get(f"/api/v1/turns/{turn.pk}").json()["calls"][0]
    assert (
        done["next_deadline"] is None and done["next_bound"] is None and done["model_events"] >= 30
    )


async def test_an_idle_dashboard_socket_outlives_the_redis_socket_timeout(
    staff: User,  # noqa: F811
) -> None:
    ws, connected, _ = await dashboard_socket(staff)
    assert connected
    assert (await ws.receive_json_from(timeout=10))["type"] == "snapshot"
    await asyncio.sleep(7)  # longer than redis-py's default socket timeout (5 s), nothing sent
    assert await ws.receive_nothing(timeout=0.1)
    await ws.send_json_to({"type": "snapshot"})
    assert (await ws.receive_json_from(timeout=10))["type"] == "snapshot"
    await ws.disconnect()
