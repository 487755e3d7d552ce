"""The per-turn websocket: token auth, and live events from a real worker through Redis."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from agentops.live import turn_group
from agentops.models import Agent, HistoryRow
from agentops.services import history_append
from inference.models import Turn
from interfaces.asgi import application
from interfaces.tasks import agent_drain
from tests.agentops.live_asgi import asgi_server
from tests.conftest import refused_with
from tests.factories import TurnFactory
from turns.services import IncomingMessage, turn_submit

pytestmark = [pytest.mark.django_db(transaction=True)]


def _queued_turn_without_enqueue(agent: Agent, text: str) -> Turn:
    row = history_append(agent=agent, participant="alice", role=HistoryRow.Role.USER, content=text)
    turn = TurnFactory.create(agent=agent, status=Turn.Status.QUEUED)
    turn.trigger_rows.add(row)
    return turn


async def _events_until_ended(
    communicator: WebsocketCommunicator, limit: int = 200
) -> list[dict[str, Any]]:
    events = []
    for _ in range(limit):
        event = await communicator.receive_json_from(timeout=20)
        events.append(event)
        if event["type"] == "turn.ended":
            break
    return events


@pytest.mark.usefixtures("workers")
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_the_websocket_streams_status_and_deltas_of_a_turn(
    make_agent: Any, operator_token: str, provider: str
) -> None:
    agent = await database_sync_to_async(make_agent)(
        provider=provider, model="answer:chunks=4,interval_ms=30"
    )
    # The turn is stored but not yet handed to a worker, so the socket is open before it runs.
    turn = await database_sync_to_async(_queued_turn_without_enqueue)(agent, "stream me")
    communicator = WebsocketCommunicator(
        application,
        f"/ws/turns/{turn.pk}?token={operator_token}",
        headers=[(b"host", b"localhost")],
    )
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
    turn, _ = await database_sync_to_async(turn_submit)(
        agent_id=agent.pk, messages=[IncomingMessage("alice", "x")]
    )
    communicator = WebsocketCommunicator(
        application, f"/ws/turns/{turn.pk}?token={token}", headers=[(b"host", b"localhost")]
    )
    assert await refused_with(communicator) == 4401


@pytest.mark.parametrize("turn_id", ["999999", "9" * 100, "0", "-1", "x"])
async def test_the_websocket_refuses_an_unknown_turn(operator_token: str, turn_id: str) -> None:
    """However it is written: an id past any key's range (its group's name would be too long
    for the channel layer) too."""
    communicator = WebsocketCommunicator(
        application,
        f"/ws/turns/{turn_id}?token={operator_token}",
        headers=[(b"host", b"localhost")],
    )
    assert await refused_with(communicator) == 4404


async def test_a_refused_socket_is_sent_nothing_of_the_turns_events(operator_token: str) -> None:
    """It had joined the turn's group before the turn was found unknown: an event of the group
    between its close and its end was sent after the close (uvicorn raises on that)."""
    communicator = WebsocketCommunicator(
        application, f"/ws/turns/999999?token={operator_token}", headers=[(b"host", b"localhost")]
    )
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    assert await communicator.receive_output(timeout=10) == {
        "type": "websocket.close",
        "code": 4404,
    }
    # Still in the group until the client's side ends.
    await get_channel_layer().group_send(
        turn_group(999999), {"type": "turn.event", "event": {"type": "call.delta", "text": "x"}}
    )
    assert await communicator.receive_nothing(timeout=1)
    await communicator.disconnect()


# --- over a real server: what a websocket client reads --------------------------------------


@pytest.fixture
def server(transactional_db: None) -> Iterator[str]:
    yield from asgi_server("websocket")


def _read_until_closed(url: str) -> tuple[list[dict[str, Any]], int | None]:
    """Every message of the socket at ``url`` until the server closes it, and the close code."""
    events = []
    with ws_connect(url, open_timeout=10) as socket:
        try:
            while True:
                events.append(json.loads(socket.recv(timeout=10)))
        except ConnectionClosed as closed:
            return events, closed.rcvd.code if closed.rcvd else None


@pytest.mark.usefixtures("no_workers")
def test_a_client_reads_why_its_socket_was_refused(
    server: str, make_agent: Any, operator_token: str
) -> None:
    """Closed before the handshake, every refusal reached a client as the same HTTP 403."""
    agent = make_agent()
    turn, _ = turn_submit(agent_id=agent.pk, messages=[IncomingMessage("alice", "x")])
    base = server.replace("http://", "ws://")
    assert _read_until_closed(f"{base}/ws/turns/{turn.pk}?token=wrong") == ([], 4401)
    assert _read_until_closed(f"{base}/ws/turns/{turn.pk + 1000}?token={operator_token}") == (
        [],
        4404,
    )


@pytest.mark.usefixtures("no_workers")
@pytest.mark.parametrize("status", Turn.ENDED)
def test_the_socket_of_a_turn_that_has_ended_says_so_and_closes(
    server: str, make_agent: Any, operator_token: str, status: str
) -> None:
    """It sent the turn's status and stayed open: a client waiting for ``turn.ended`` waited
    forever."""
    turn = TurnFactory.create(agent=make_agent(), status=status)
    events, code = _read_until_closed(
        f"{server.replace('http://', 'ws://')}/ws/turns/{turn.pk}?token={operator_token}"
    )
    assert events == [
        {"type": "turn.status", "turn": turn.pk, "status": status},
        {"type": "turn.ended", "turn": turn.pk, "status": status},
    ]
    assert code == 1000
