"""Calls through a real worker and the stand-in record their timeline's marks, and the admin
draws them: the deadline derived from the recorded instants is the one that cut the call."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from calls.bounds import BoundsSettings, bound_deadlines
from calls.client import MARKS_HEAD, MARKS_TAIL
from calls.timeline import call_state
from inference.models import InferenceCall
from tests.conftest import WorkerPool, worker_pool
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True)]

BOUNDS: dict[str, Any] = {
    "progress_bounds": {
        "before_content_ms": 500,
        "between_events_ms": 500,
        "think_tokens_per_second": 87,
    },
    "flat_minimum_ms": 2000,
    "absolute_ms": 2500,
}


@pytest.fixture(scope="module")
def timeline_pool(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(
        1,
        label="timeline",
        extra_env={
            "AGENTOPS_INFERENCE_BOUNDS": json.dumps(BOUNDS),
            "AGENTOPS_DEADLINE_RETRY_DELAY_MS": "100",
        },
    )


@pytest.fixture
def bounded(timeline_pool: WorkerPool) -> WorkerPool:
    return timeline_pool.routed()


def first_call(turn_id: int) -> InferenceCall:
    call = InferenceCall.objects.filter(turn_id=turn_id).order_by("id").first()
    assert call is not None
    return call


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_call_cut_between_events_records_its_marks_and_its_deadline_derives_from_them(
    bounded: WorkerPool, api: Client, make_agent: Any, provider: str
) -> None:
    agent = make_agent(
        provider=provider, model="silent-after-content:after_chunks=3,interval_ms=40,pings_ms=100"
    )
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    call = first_call(turn["id"])
    assert call.outcome == "cut" and call.bound == "between_events"
    marks = call.marks
    assert len(marks["events"]) == call.model_events >= 3 and marks["events_omitted"] == 0
    # Pings came every 100 ms through 500 ms of silence; each is counted and marked (the
    # headers are neither: they have their own instant).
    assert len(marks["keepalives"]) == call.keepalives >= 3
    assert marks["events"] == sorted(marks["events"]) and marks["keepalives"] == sorted(
        marks["keepalives"]
    )
    # The stream's start is no model event (a keepalive); then the pings through the silence.
    assert len([k for k in marks["keepalives"] if k > marks["events"][-1]]) >= 3
    assert marks["bounds"] == {
        **BOUNDS["progress_bounds"],
        "flat_minimum_ms": 2000,
        "absolute_ms": 2500,
    }

    assert call.sent_at is not None and call.bound_deadline is not None
    derived = {
        d.bound.value: d.at
        for d in bound_deadlines(call_state(call), BoundsSettings(**marks["bounds"]))
    }
    recorded = (call.bound_deadline - call.sent_at).total_seconds() * 1000
    assert derived["between_events"] == pytest.approx(recorded, abs=0.01)
    assert derived["between_events"] == pytest.approx(marks["events"][-1] + 500, abs=1)

    admin = Client()
    admin.force_login(User.objects.create_superuser("root", password="x"))
    page = admin.get(f"/admin/inference/inferencecall/{call.pk}/change/").content.decode()
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="call-timeline"' in page
    assert page.count('class="keepalive"') == len(marks["keepalives"]) and 'class="cut"' in page
    assert "between-events deadline" in page and "(cut the call)" in page


def test_a_long_stream_keeps_its_first_and_last_marks_and_counts_the_rest(
    bounded: WorkerPool, api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="endless:interval_ms=1")
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    call = first_call(turn["id"])
    assert call.outcome == "cut" and call.bound == "absolute"
    marks = call.marks
    assert call.model_events > MARKS_HEAD + MARKS_TAIL
    assert len(marks["events"]) == MARKS_HEAD and len(marks["events_tail"]) == MARKS_TAIL
    assert marks["events_omitted"] == call.model_events - MARKS_HEAD - MARKS_TAIL
    assert call.last_event_at is not None and call.sent_at is not None
    last = (call.last_event_at - call.sent_at).total_seconds() * 1000
    assert marks["events_tail"][-1] == round(last)
    assert marks["events"][-1] < marks["events_tail"][0]
