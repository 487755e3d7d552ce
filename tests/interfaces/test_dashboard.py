"""The live operator dashboard: its page and its websocket, against the real ASGI application,
the real Redis channel layer and (for calls) a real worker and the stand-in."""

from __future__ import annotations

import json
import math
import re
import time
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client

from agentops.alerts import alert_raise
from agentops.models import Agent
from calls.config import bounds_settings
from calls.events import call_deadline_ms
from interfaces.asgi import application
from tests.conftest import refused_with
from tests.factories import AgentFactory, CallFactory
from tests.interfaces.test_production import asgi_get
from tests.turns.test_websocket import _queued_turn_without_enqueue
from tests.waits.conftest import manage
from waits.clock import clock_ms
from waits.services import wait_record, wait_release

pytestmark = [pytest.mark.django_db(transaction=True)]

HOST = [(b"host", b"localhost"), (b"origin", b"http://localhost")]


@pytest.fixture
def staff(db: None) -> User:
    return User.objects.create_user("olga", password="not-used", is_staff=True)


@pytest.fixture
def not_staff(db: None) -> User:
    return User.objects.create_user("nick", password="not-used", is_staff=False)


def session_cookie(user: User) -> str:
    """The ``sessionid`` a browser holds after signing in to the admin as ``user``."""
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def dashboard_communicator(
    user: User | None, *, origin: bytes = b"http://localhost"
) -> WebsocketCommunicator:
    headers = [(b"host", b"localhost"), (b"origin", origin)]
    if user is not None:
        cookie = await database_sync_to_async(session_cookie)(user)
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, "/ws/dashboard", headers=headers)


async def dashboard_socket(
    user: User | None, *, origin: bytes = b"http://localhost"
) -> tuple[WebsocketCommunicator, bool, Any]:
    communicator = await dashboard_communicator(user, origin=origin)
    connected, code = await communicator.connect(timeout=10)
    return communicator, connected, code


# --- the websocket ------------------------------------------------------------------------


async def test_the_dashboard_socket_sends_a_snapshot_then_a_new_alert_and_a_holds_start_and_end(
    staff: User,
) -> None:
    agent: Agent = await database_sync_to_async(AgentFactory.create)(name="ada", model="m1")
    ws, connected, _ = await dashboard_socket(staff)
    assert connected
    snapshot = await ws.receive_json_from(timeout=10)
    assert snapshot["type"] == "snapshot"
    assert (
        snapshot["calls"] == []
        and snapshot["holds"] == []
        and snapshot["alerts"] == []
        and snapshot["journal_readable"] is True
    )
    [breaker] = snapshot["breakers"]
    assert breaker["agent"] == "ada" and breaker["streak"] == 0 and breaker["probe"] is None
    assert breaker["context"] == {"window": None, "last_input_tokens": None, "used_fraction": None}

    alert = await database_sync_to_async(alert_raise)(
        kind="hard-down", agent="ada", model="m1", message="ada failed 3 times in a row"
    )
    event = await ws.receive_json_from(timeout=10)
    assert event["type"] == "alert.raised"
    assert (
        event["alert"]["id"] == alert.pk
        and event["alert"]["kind"] == "hard-down"
        and event["alert"]["message"] == "ada failed 3 times in a row"
    )

    now = clock_ms()
    await database_sync_to_async(wait_record)(
        agent=agent, model="m1", retry_after_ms=600_000, reason="HTTP 429: slow down", now_ms=now
    )
    started = await ws.receive_json_from(timeout=10)
    assert started == {
        "type": "hold.started",
        "hold": {
            "agent": "ada",
            "model": "m1",
            "until_ms": math.ceil(now + 600_000),
            "reason": "HTTP 429: slow down",
            "set_at_ms": now,
            "source": "recorded",
        },
    }

    await database_sync_to_async(wait_release)(
        agent="ada", model="m1", requester="olga", reason="the provider says fine", via="api"
    )
    ended = await ws.receive_json_from(timeout=10)
    assert ended == {
        "type": "hold.ended",
        "hold": {
            "agent": "ada",
            "model": "m1",
            "why": "released by api:olga: the provider says fine",
        },
    }

    await ws.send_json_to({"type": "snapshot"})
    again = await ws.receive_json_from(timeout=10)
    assert (
        again["type"] == "snapshot"
        and again["holds"] == []
        and [a["id"] for a in again["alerts"]] == [alert.pk]
    )
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_a_release_from_the_management_command_reaches_the_dashboard_before_the_command_exits(
    staff: User,
) -> None:
    agent: Agent = await database_sync_to_async(AgentFactory.create)(name="ada", model="m1")
    await database_sync_to_async(wait_record)(
        agent=agent, model="m1", retry_after_ms=600_000, reason="HTTP 429", now_ms=clock_ms()
    )
    ws, connected, _ = await dashboard_socket(staff)
    assert connected
    assert len((await ws.receive_json_from(timeout=10))["holds"]) == 1
    # Another process, short-lived: its events must go out before it exits.
    done = await database_sync_to_async(manage)(
        "release_wait", "ada", "--model", "m1", "--reason", "from the shell", "--requester", "olga"
    )
    assert done.returncode == 0, done.stderr
    ended = await ws.receive_json_from(timeout=10)
    assert ended == {
        "type": "hold.ended",
        "hold": {"agent": "ada", "model": "m1", "why": "released by command:olga: from the shell"},
    }
    await ws.disconnect()


async def test_a_wait_that_changes_nothing_sends_no_hold_event(staff: User) -> None:
    agent: Agent = await database_sync_to_async(AgentFactory.create)(name="ada", model="m1")
    now = clock_ms()
    await database_sync_to_async(wait_record)(
        agent=agent, model="m1", retry_after_ms=600_000, reason="first", now_ms=now
    )
    ws, connected, _ = await dashboard_socket(staff)
    assert connected
    snapshot = await ws.receive_json_from(timeout=10)
    assert [(h["agent"], h["model"], h["reason"]) for h in snapshot["holds"]] == [
        ("ada", "m1", "first")
    ]
    # A shorter wait than the one binding changes nothing: no event.
    await database_sync_to_async(wait_record)(
        agent=agent, model="m1", retry_after_ms=1000, reason="shorter", now_ms=now
    )
    assert await ws.receive_nothing(timeout=0.5)
    await ws.disconnect()


# As ASGI messages: the communicator's send_to refuses an empty frame.
BAD_FRAMES: list[dict[str, Any]] = [
    {"bytes": b"\x00\x01binary"},
    {"bytes": b""},
    {"text": ""},
    {"text": "{not json"},
    {"text": "[" * 100_000},  # deeper than the JSON decoder recurses
    {"text": "[1, 2]"},
    {"text": '"snapshot"'},
    {"text": '{"type": "delete-everything"}'},
    {"text": '{"type": ["snapshot"]}'},
]


async def test_bad_frames_and_unknown_messages_are_ignored_and_the_socket_keeps_working(
    staff: User,
) -> None:
    ws, connected, _ = await dashboard_socket(staff)
    assert connected
    assert (await ws.receive_json_from(timeout=10))["type"] == "snapshot"
    for frame in BAD_FRAMES:
        await ws.send_input({"type": "websocket.receive", **frame})
        assert await ws.receive_nothing(timeout=0.1), frame  # no reply, no close, no crash
    alert = await database_sync_to_async(alert_raise)(
        kind="hard-down", agent="ada", model="m1", message="still here"
    )
    event = await ws.receive_json_from(timeout=10)  # re-raises the consumer's error had it crashed
    assert event["type"] == "alert.raised" and event["alert"]["id"] == alert.pk
    await ws.disconnect()


async def test_snapshot_requests_are_answered_at_most_once_per_two_seconds(staff: User) -> None:
    ws, connected, _ = await dashboard_socket(staff)
    assert connected
    assert (await ws.receive_json_from(timeout=10))["type"] == "snapshot"
    first = time.monotonic()
    for _ in range(5):
        await ws.send_json_to({"type": "snapshot"})
    # The five are answered by one snapshot, deferred to the end of the window the first opened.
    deferred = await ws.receive_json_from(timeout=10)
    assert deferred["type"] == "snapshot" and time.monotonic() - first > 1.5
    assert await ws.receive_nothing(timeout=2.5)
    # The window has passed: the next request is answered at once.
    await ws.send_json_to({"type": "snapshot"})
    asked = time.monotonic()
    assert (await ws.receive_json_from(timeout=10))[
        "type"
    ] == "snapshot" and time.monotonic() - asked < 1.0
    await ws.disconnect()


async def test_an_anonymous_connection_is_refused_with_4401(db: None) -> None:
    assert await refused_with(await dashboard_communicator(None)) == 4401


async def test_a_user_who_is_not_staff_is_refused_with_4403(not_staff: User) -> None:
    assert await refused_with(await dashboard_communicator(not_staff)) == 4403


@pytest.mark.parametrize(
    "origin",
    [
        b"https://evil.example",
        b"http://localhost:8001",
        b"https://localhost",
        b"http://localhost.evil.example",
        b"null",
        b"",
    ],
    ids=["another-site", "another-port", "another-scheme", "a-longer-name", "null", "none"],
)
async def test_a_page_on_another_origin_cannot_open_the_socket_with_the_staff_cookie(
    staff: User, origin: bytes
) -> None:
    # The same host on another port (another service's page, say) passed the old host-only check.
    _, connected, _ = await dashboard_socket(staff, origin=origin)
    assert not connected


@pytest.mark.parametrize(
    "origin", [b"http://localhost", b"http://localhost:80", b"HTTP://LOCALHOST/"]
)
async def test_the_sites_own_pages_open_the_socket(staff: User, origin: bytes) -> None:
    ws, connected, _ = await dashboard_socket(staff, origin=origin)
    assert connected
    await ws.disconnect()


async def test_a_socket_past_the_processs_cap_is_closed_with_4429_and_the_first_ones_stay(
    staff: User, settings: Any
) -> None:
    settings.AGENTOPS_DASHBOARD_SOCKETS = 2
    first = [await dashboard_socket(staff) for _ in range(2)]
    assert all(connected for _, connected, _ in first)
    assert await refused_with(await dashboard_communicator(staff)) == 4429
    await first[0][0].disconnect()
    again, connected, _ = await dashboard_socket(staff)  # room again once one closed
    assert connected
    for ws in (first[1][0], again):
        await ws.disconnect()


@pytest.mark.usefixtures("workers")
async def test_a_call_in_flight_shows_with_its_deadline_and_its_end(
    staff: User, make_agent: Any
) -> None:
    agent = await database_sync_to_async(make_agent)(model="answer:chunks=3,interval_ms=100")
    turn = await database_sync_to_async(_queued_turn_without_enqueue)(agent, "hello")
    ws, connected, _ = await dashboard_socket(staff)
    assert connected
    assert (await ws.receive_json_from(timeout=10))["type"] == "snapshot"
    from interfaces.tasks import agent_drain

    await database_sync_to_async(agent_drain.delay)(agent.pk)
    started = await ws.receive_json_from(timeout=20)
    assert started["type"] == "call.started"
    call = started["call"]
    assert (call["agent"], call["model"], call["kind"], call["turn"], call["streamed"]) == (
        agent.name,
        agent.model,
        "primary",
        turn.pk,
        True,
    )
    # The workers run the default bounds: 60 s before content, 75 min in all.
    assert call["bound"] == "before_content" and call["deadline_ms"] - call["since_ms"] == 60_000
    assert call["final_bound"] == "absolute" and call["final_ms"] - call["since_ms"] == 75 * 60_000
    ended = await ws.receive_json_from(timeout=20)
    while ended["type"] == "call.progress":  # the stream's live progress comes between
        ended = await ws.receive_json_from(timeout=20)
    assert ended["type"] == "call.ended"
    assert (
        ended["call"]["id"] == call["id"]
        and ended["call"]["outcome"] == "completed"
        and ended["call"]["bound"] is None
    )
    await ws.disconnect()


# --- a call's deadlines ---------------------------------------------------------------------

T = 1_800_000_000_000.0


@pytest.mark.parametrize(
    ("bounds", "streamed", "max_tokens", "expected"),
    [
        # Defaults: 60 s before content, 75 min in all; non-streamed: max(150 s, 1862 s) flat.
        ("", True, None, (T + 60_000, "before_content", T + 4_500_000, "absolute")),
        ("", False, None, (T + 1_862_000, "whole_call", T + 1_862_000, "whole_call")),
        ("", False, 870, (T + 160_000, "whole_call", T + 160_000, "whole_call")),
        # The flat bound ties with the before-content one at send (5 s each): the tie goes to the
        # bound listed first. An absolute bound shorter than the rest is both nearest and final.
        (
            '{"progress_bounds": {"before_content_ms": 5000, "between_events_ms": 1000}, '
            '"flat_minimum_ms": 3000}',
            True,
            None,
            (T + 5000, "before_content", T + 4_500_000, "absolute"),
        ),
        ('{"absolute_ms": 1000}', True, None, (T + 1000, "absolute", T + 1000, "absolute")),
        ("false", True, None, (None, None, None, None)),
    ],
)
def test_a_calls_nearest_and_final_deadline_are_those_of_the_bounds(
    settings: Any,
    bounds: str,
    streamed: bool,
    max_tokens: int | None,
    expected: tuple[Any, ...],
) -> None:
    settings.AGENTOPS_INFERENCE_BOUNDS = bounds
    bounds_settings.cache_clear()  # read once per process
    try:
        shown = call_deadline_ms(sent_ms=T, streamed=streamed, max_tokens=max_tokens)
    finally:
        bounds_settings.cache_clear()
    assert (
        shown["deadline_ms"],
        shown["bound"],
        shown["final_ms"],
        shown["final_bound"],
    ) == expected


# --- the page -----------------------------------------------------------------------------


def test_the_page_sends_an_anonymous_visitor_to_the_admin_login(db: None) -> None:
    response = Client().get("/dashboard/")
    assert response.status_code == 302 and response["Location"] == "/admin/login/?next=/dashboard/"


def test_the_page_sends_a_user_who_is_not_staff_to_the_admin_login(not_staff: User) -> None:
    client = Client()
    client.force_login(not_staff)
    response = client.get("/dashboard/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_the_page_shows_staff_the_snapshot_and_serves_its_script(staff: User) -> None:
    agent: Agent = AgentFactory.create(name="ada", model="m1")
    CallFactory.create(agent=agent, model="m1", streamed=True)  # in flight
    wait_record(
        agent=agent,
        model="m1",
        retry_after_ms=600_000,
        reason="HTTP 429: slow down",
        now_ms=clock_ms(),
    )
    alert_raise(kind="hard-down", agent="ada", model="m1", message="ada failed 3 times in a row")
    client = Client()
    client.force_login(staff)
    response = client.get("/dashboard/")
    assert response.status_code == 200
    html = response.content.decode()
    found = re.search(
        r'<script id="dashboard-snapshot" type="application/json">(.*?)</script>', html, re.S
    )
    assert found is not None
    snapshot = json.loads(found.group(1))
    assert [(c["agent"], c["model"], c["bound"]) for c in snapshot["calls"]] == [
        ("ada", "m1", "before_content")
    ]
    assert [(h["agent"], h["model"], h["reason"]) for h in snapshot["holds"]] == [
        ("ada", "m1", "HTTP 429: slow down")
    ]
    assert [a["message"] for a in snapshot["alerts"]] == ["ada failed 3 times in a row"]
    assert [b["agent"] for b in snapshot["breakers"]] == ["ada"]
    assert (
        'src="/static/agentops/dashboard.js"' in html and "/static/agentops/dashboard.css" in html
    )
    script = asgi_get(
        "/static/agentops/dashboard.js"
    )  # static files are the ASGI app's (WhiteNoise)
    assert script.status_code == 200 and b'"/ws/dashboard"' in script.content
