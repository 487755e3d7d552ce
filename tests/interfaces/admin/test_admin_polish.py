"""What an operator reads in the admin: turns named by their agent, call errors as type, HTTP
status, stated wait and message, instants to the second with a relative form, cut lateness in
words, alert messages cut between words, and Binding waits with a countdown and links."""

from __future__ import annotations

import math
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from agentops.alerts import alert_raise
from agentops.models import Agent
from inference.models import InferenceCall, Turn
from tests.factories import AgentFactory, CallFactory, TurnFactory
from waits.clock import clock_ms
from waits.services import wait_record

pytestmark = pytest.mark.django_db

SECONDS = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


@pytest.fixture
def agent() -> Agent:
    made: Agent = AgentFactory.create(name="ada", model="m1")
    return made


@pytest.fixture
def call(agent: Agent) -> InferenceCall:
    turn = TurnFactory.create(agent=agent, status=Turn.Status.HELD)
    sent = timezone.now() - timedelta(minutes=3)
    return CallFactory.create(
        turn=turn,
        agent=agent,
        kind="primary",
        model="m1",
        streamed=True,
        sent_at=sent,
        ended_at=sent + timedelta(seconds=1),
        outcome="error",
        cut_lateness_ms=12.345678,
        error={
            "type": "rate_limit",
            "http_status": 429,
            "provider_code": "rate_limit_exceeded",
            "message": "Slow down, please",
            "retryable": True,
            "retry_after_ms": 7_200_000,
        },
    )


def test_a_turn_is_named_by_its_agent(call: InferenceCall) -> None:
    assert str(call.turn) == f"turn {call.turn_id} of ada (held)"


def test_a_calls_page_renders_its_error_and_its_instants_to_the_second(
    admin_client: Client, call: InferenceCall
) -> None:
    page = admin_client.get(f"/admin/inference/inferencecall/{call.pk}/change/").content.decode()
    for part in (
        "<strong>rate_limit</strong>",
        "HTTP 429",
        "asked to wait 2 h",
        "Slow down, please",
        "12 ms after its deadline",
        "3 min ago",
    ):
        assert part in page, part
    assert (
        "&quot;retry_after_ms&quot;" not in page and '"retry_after_ms"' not in page
    )  # not a raw JSON blob
    assert SECONDS.search(page)


def test_a_turns_inline_calls_show_the_http_status_and_stated_wait(
    admin_client: Client, call: InferenceCall
) -> None:
    page = admin_client.get(f"/admin/inference/turn/{call.turn_id}/change/").content.decode()
    assert "HTTP 429" in page and "asked to wait 2 h" in page
    assert "turn " + str(call.turn_id) + " of ada" in page


def test_lists_show_instants_to_the_second_with_a_relative_form(
    admin_client: Client, call: InferenceCall
) -> None:
    page = admin_client.get("/admin/inference/inferencecall/").content.decode()
    assert SECONDS.search(page) and "3 min ago" in page


def test_an_alerts_message_is_cut_between_words_in_the_list(admin_client: Client) -> None:
    words = " ".join(f"w{i:03d}ab" for i in range(60))  # 7 per word: 160 falls mid-word
    alert_raise(kind="provider-wait", agent="ada", model="m1", message=words)
    page = admin_client.get("/admin/agentops/alert/").content.decode()
    shown = re.search(r"(w000ab[^<]*…)", page)
    assert shown is not None
    assert re.fullmatch(r"(w\d{3}ab )*w\d{3}ab…", shown.group(1))


def test_binding_waits_show_a_countdown_and_link_the_agent_and_its_turn(
    admin_client: Client, call: InferenceCall, agent: Agent
) -> None:
    now = clock_ms()
    wait_record(agent=agent, model="m1", retry_after_ms=7_200_000, reason="429", now_ms=now)
    wait_record(agent=agent, model="m2", retry_after_ms=math.nan, reason="429", now_ms=now)
    page = admin_client.get("/admin/waits/bindingwait/").content.decode()
    until = re.search(r'class="wait-countdown" data-until-ms="(\d+)"', page)
    assert until is not None and abs(int(until.group(1)) - (now + 7_200_000)) < 2
    assert f'href="/admin/agentops/agent/{agent.pk}/change/"' in page
    assert f'href="/admin/inference/turn/{call.turn_id}/change/">turn {call.turn_id}</a>' in page
    assert "until released" in page
    assert "setInterval(tick, 1000)" in page


def test_the_admins_own_date_fields_show_seconds() -> None:
    """FORMAT_MODULE_PATH: every instant the admin renders by itself (e.g. ``headers_at``)."""
    from datetime import UTC, datetime

    from django.contrib.admin.utils import display_for_value

    assert (
        display_for_value(datetime(2027, 1, 15, 10, 0, 7, tzinfo=UTC), "-")
        == "2027-01-15 10:00:07 UTC"
    )
