"""The per-turn websocket: token auth, and live events from a real worker through Redis."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from agentops.asgi import application
from agentops.models import Agent, HistoryRow
from agentops.services import history_append
from inference.models import Turn
from inference.tasks import agent_drain
from inference.turns.services import IncomingMessage, turn_submit

pytestmark = [pytest.mark.django_db(transaction=True)]


def _queued_turn_without_enqueue(agent: Agent, text: str) -> Turn:
    row = history_append(agent=agent, participant="alice", role=HistoryRow.Role.USER, content=text)
    turn = Turn.objects.create(agent=agent, status=Turn.Status.QUEUED)
    turn.trigger_rows.add(row)
    return turn


async def _events_until_ended(communicator: WebsocketCommunicator, limit: int = 200) -> list[dict[str, Any]]:
    events = []
    for _ in range(limit):
        event = await communicator.receive_json_from(timeout=20)
        events.append(event)
        if event["type"] == "turn.ended":
            break
    return events


@pytest.mark.usefixtures("workers")
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_the_websocket_streams_status_and_deltas_of_a_turn(make_agent: Any, operator_token: str, provider: str) -> None:
    agent = await database_sync_to_async(make_agent)(provider=provider, model="answer:chunks=4,interval_ms=30")
    # The turn is stored but not yet handed to a worker, so the socket is open before it runs.
    turn = await database_sync_to_async(_queued_turn_without_enqueue)(agent, "stream me")
    communicator = WebsocketCommunicator(application, f"/ws/turns/{turn.pk}?token={operator_token}", headers=[(b"host", b"localhost")])
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    agent_drain.delay(agent.pk)
    events = await _events_until_ended(communicator)
    await communicator.disconnect()

    kinds = [e["type"] for e in events]
    assert kinds[0] == "turn.status"
    assert "call.started" in kinds and "call.ended" in kinds and kinds[-1] == "turn.ended"
    assert {"type": "turn.status", "turn": turn.pk, "status": "running"} in events
    deltas = [e["text"] for e in events if e["type"] == "call.delta"]
    assert len(deltas) == 4
    assert "".join(deltas) == "Stand-in answer to: alice: stream me"
    assert events[-1]["status"] == "succeeded"


@pytest.mark.usefixtures("no_workers")  # the turn is submitted only to be refused a look at
@pytest.mark.parametrize("token", ["", "wrong"])
async def test_the_websocket_refuses_a_bad_token(make_agent: Any, token: str) -> None:
    agent = await database_sync_to_async(make_agent)()
    turn, _ = await database_sync_to_async(turn_submit)(agent_id=agent.pk, messages=[IncomingMessage("alice", "x")])
    communicator = WebsocketCommunicator(application, f"/ws/turns/{turn.pk}?token={token}", headers=[(b"host", b"localhost")])
    connected, code = await communicator.connect(timeout=10)
    assert not connected and code == 4401


async def test_the_websocket_refuses_an_unknown_turn(operator_token: str) -> None:
    communicator = WebsocketCommunicator(application, f"/ws/turns/999999?token={operator_token}", headers=[(b"host", b"localhost")])
    connected, code = await communicator.connect(timeout=10)
    assert not connected and code == 4404
