"""A recorded call as its picture's values: each bound's deadline as it stood, from the recorded
instants and the bounds the call ran under (calls.timeline, calls.records.call_marks)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client

from calls.bounds import Bound, BoundsSettings, CallState, bound_deadlines, next_deadline
from calls.client import MARKS_HEAD, MARKS_TAIL, Timeline
from calls.records import call_marks
from calls.timeline import call_deadlines, call_picture, call_timeline_svg
from inference.models import InferenceCall
from tests.factories import CallFactory

SETTINGS = BoundsSettings(
    before_content_ms=500,
    between_events_ms=400,
    think_tokens_per_second=100,
    flat_minimum_ms=2000,
    absolute_ms=2500,
)
SENT = datetime(2027, 1, 15, 8, 0, tzinfo=UTC)


def at(ms: float) -> datetime:
    return SENT + timedelta(milliseconds=ms)


STATES = [
    CallState(
        sent=0,
        streamed=streamed,
        max_tokens=max_tokens,
        thinking_start=thinking,
        first_content=content,
        last_model_event=last,
        last_event_was_thinking_start=was_thinking,
    )
    for streamed, max_tokens, thinking, content, last, was_thinking in itertools.product(
        (True, False),
        (None, 50, 5000),
        (None, 100.0),
        (None, 300.0),
        (None, 300.0, 2100.0),
        (False, True),
    )
]


@pytest.mark.parametrize(
    "settings",
    [SETTINGS, BoundsSettings(), BoundsSettings(before_content_ms=3000, flat_minimum_ms=10)],
)
def test_the_earliest_of_every_bounds_deadline_is_the_one_the_reader_arms(
    settings: BoundsSettings,
) -> None:
    for state in STATES:
        every = bound_deadlines(state, settings)
        assert min(every, key=lambda d: d.at) == next_deadline(state, settings), state
        assert len({d.bound for d in every}) == len(every)


def test_a_streamed_call_has_a_progress_bound_the_flat_and_the_absolute_bound() -> None:
    before = bound_deadlines(CallState(sent=0, streamed=True), SETTINGS)
    assert [(d.bound, d.at) for d in before] == [
        (Bound.BEFORE_CONTENT, 500),
        (Bound.FLAT, 2000),
        (Bound.ABSOLUTE, 2500),
    ]
    after = bound_deadlines(
        CallState(sent=0, streamed=True, first_content=100, last_model_event=300), SETTINGS
    )
    assert [(d.bound, d.at) for d in after] == [
        (Bound.BETWEEN_EVENTS, 700),
        (Bound.FLAT, 2300),
        (Bound.ABSOLUTE, 2500),
    ]


def test_the_marks_keep_offsets_from_send_the_first_and_last_ones_and_count_those_left_out() -> (
    None
):
    t = Timeline(sent=1000.4, headers=1010.0)
    for i in range(1000):
        t.mark_event(1000.4 + i)
    for now in (1100.0, 1200.8, 1300.5):
        t.mark_keepalive(now)
    assert (t.model_events, t.keepalives) == (1000, 3)
    marks = call_marks(t, SETTINGS)
    assert marks["events"] == list(range(MARKS_HEAD)) and marks["events_tail"] == list(
        range(1000 - MARKS_TAIL, 1000)
    )
    assert marks["events_omitted"] == 750
    assert (
        marks["keepalives"] == [100, 200, 300]
        and marks["keepalives_tail"] == []
        and marks["keepalives_omitted"] == 0
    )
    assert marks["bounds"] == {
        "before_content_ms": 500,
        "between_events_ms": 400,
        "think_tokens_per_second": 100,
        "flat_minimum_ms": 2000,
        "absolute_ms": 2500,
    }
    assert call_marks(t, None)["bounds"] is None


def recorded(**fields: object) -> InferenceCall:
    marks = {
        "events": [40, 90, 140],
        "events_tail": [],
        "events_omitted": 0,
        "keepalives": [300, 400],
        "keepalives_tail": [],
        "keepalives_omitted": 0,
        "bounds": {
            "before_content_ms": 500,
            "between_events_ms": 400,
            "think_tokens_per_second": 100,
            "flat_minimum_ms": 2000,
            "absolute_ms": 2500,
        },
    }
    values: dict[str, object] = {
        "kind": "primary",
        "model": "m",
        "streamed": True,
        "max_tokens": None,
        "sent_at": SENT,
        "headers_at": at(10),
        "first_event_at": at(40),
        "first_content_at": at(40),
        "last_event_at": at(140),
        "ended_at": at(560),
        "model_events": 3,
        "keepalives": 3,
        "outcome": "cut",
        "bound": "between_events",
        "bound_deadline": at(540),
        "cut_lateness_ms": 4.0,
        "marks": marks,
        **fields,
    }
    return CallFactory.create(**values)


@pytest.mark.django_db
def test_a_cut_calls_picture_has_its_deadlines_as_they_stood_and_the_cut_with_its_lateness() -> (
    None
):
    picture = call_picture(recorded())
    assert picture is not None
    assert [(m.label, m.at) for m in picture.milestones] == [
        ("send", 0),
        ("headers", 10),
        ("first content", 40),
    ]
    assert picture.events == (40, 90, 140) and picture.keepalives == (300, 400)
    assert [(d.bound, d.at, d.cut, d.met) for d in picture.deadlines] == [
        ("before_content", 500, False, True),  # content came at 40 ms, before its 500 ms deadline
        ("between_events", 540, True, False),  # last event at 140 ms + 400 ms: the one that cut
        ("flat", 2140, False, False),
        ("absolute", 2500, False, False),
    ]
    assert picture.cut_at == 544 and picture.cut_lateness_ms == 4
    assert 'class="cut"' in call_timeline_svg(recorded())


@pytest.mark.django_db
def test_the_picture_uses_the_bounds_the_call_ran_under_not_those_in_force_now() -> None:
    call = recorded()
    call.marks["bounds"]["between_events_ms"] = 900
    call.bound_deadline = at(1040)
    deadlines = {
        d.bound: d.at for d in call_deadlines(call, BoundsSettings(**call.marks["bounds"]))
    }
    assert deadlines["between_events"] == 1040
    picture = call_picture(call)
    assert (
        picture is not None and {d.bound: d.at for d in picture.deadlines}["between_events"] == 1040
    )


@pytest.mark.django_db
def test_a_thinking_start_as_the_last_event_extends_the_deadline_by_the_thinking_allowance() -> (
    None
):
    # max_tokens 100 at 100 tokens/s: a thinking block's allowance is 1000 ms from its start.
    # Derived from the recorded instants alone (a call that was not cut records no deadline).
    call = recorded(
        max_tokens=100,
        thinking_started_at=at(140),
        outcome="aborted",
        bound=None,
        bound_deadline=None,
    )
    deadlines = {d.bound: d.at for d in call_deadlines(call, SETTINGS)}
    assert deadlines["between_events"] == 1140
    call = recorded(
        max_tokens=100,
        thinking_started_at=at(90),
        outcome="aborted",
        bound=None,
        bound_deadline=None,
    )
    assert {d.bound: d.at for d in call_deadlines(call, SETTINGS)}["between_events"] == 540


@pytest.mark.django_db
def test_a_non_streamed_call_has_the_whole_call_bound_only() -> None:
    call = recorded(
        streamed=False,
        max_tokens=None,
        first_content_at=None,
        outcome="completed",
        bound=None,
        bound_deadline=None,
    )
    picture = call_picture(call)
    assert picture is not None
    assert [(d.bound, d.at) for d in picture.deadlines] == [("whole_call", 2000)]
    assert picture.cut_at is None and picture.end == 560


@pytest.mark.django_db
def test_a_call_not_sent_yet_has_no_picture_and_one_with_bounds_off_says_so() -> None:
    assert call_timeline_svg(recorded(sent_at=None)) == ""
    off = recorded(outcome="completed", bound=None, bound_deadline=None)
    off.marks["bounds"] = None
    picture = call_picture(off)
    assert (
        picture is not None
        and picture.deadlines == ()
        and picture.notes == ("bounds were off for this call",)
    )


@pytest.mark.django_db
def test_stored_marks_with_an_unknown_bound_field_and_an_unknown_bound_name_still_make_a_picture_and_a_page() -> (
    None
):
    # As a newer (or older) version might have stored them.
    call = recorded(bound="between_keepalives", bound_deadline=at(700))
    call.marks["bounds"] = {
        "before_content_ms": 500,
        "between_events_ms": 400,
        "think_tokens_per_second": 0,
        "flat_minimum_ms": "2000",
        "between_keepalives_ms": 200,
    }
    call.marks["events"] = [40, "ninety", None, 140]
    call.marks["events_omitted"] = "many"
    call.save()
    picture = call_picture(call)
    assert picture is not None
    deadlines = {d.bound: (d.at, d.cut) for d in picture.deadlines}
    assert deadlines["between_keepalives"] == (700, True)  # labelled by its stored name
    assert deadlines["between_events"] == (540, False)  # the known fields still apply
    assert (
        deadlines["flat"][0] == 140 + BoundsSettings().flat_minimum_ms
    )  # an unusable value takes its default
    assert picture.events == (40, 140) and picture.events_omitted == 0
    [note] = picture.notes
    assert note == (
        "recorded bounds left out: between_keepalives_ms, flat_minimum_ms, "
        "think_tokens_per_second; defaults used for absolute_ms, flat_minimum_ms, "
        "think_tokens_per_second"
    )
    assert "between-keepalives deadline" in call_timeline_svg(call)

    admin = Client()
    admin.force_login(User.objects.create_superuser("root", password="x"))
    page = admin.get(f"/admin/inference/inferencecall/{call.pk}/change/")
    assert page.status_code == 200 and "between-keepalives deadline" in page.content.decode()


@pytest.mark.django_db
@pytest.mark.parametrize("stored", [[500, 400], "fast", 7])
def test_recorded_bounds_that_are_not_an_object_fall_back_to_the_bounds_in_force_now(
    stored: object,
) -> None:
    call = recorded(outcome="completed", bound=None, bound_deadline=None)
    call.marks["bounds"] = stored
    picture = call_picture(call)
    assert picture is not None and picture.deadlines
    assert picture.notes == (
        "deadlines from the bounds in force now (this call's recorded bounds are unreadable)",
    )
