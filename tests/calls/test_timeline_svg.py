"""The picture of a call's timeline: pure values in, escaped SVG out (calls.timeline_svg)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from calls.timeline_svg import CallPicture, DeadlineMark, Milestone, fmt_ms, render_svg

SVG = "{http://www.w3.org/2000/svg}"

CUT_CALL = CallPicture(
    outcome="cut",
    milestones=(Milestone(0, "send"), Milestone(12, "headers"), Milestone(40, "first content")),
    events=(40.0, 90.0, 140.0),
    keepalives=(300.0, 400.0, 500.0, 600.0),
    deadlines=(
        DeadlineMark("before_content", 500, met=True),
        DeadlineMark("between_events", 640, cut=True),
        DeadlineMark("flat", 2140),
        DeadlineMark("absolute", 2500),
    ),
    cut_at=643.0,
    cut_lateness_ms=3.0,
    end=650.0,
)


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def by_class(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def x_of(line: ET.Element) -> float:
    return float(line.get("x1") or "nan")


@pytest.mark.parametrize("small", [False, True])
def test_a_cut_call_draws_every_event_and_keepalive_each_deadline_in_view_and_the_cut(
    small: bool,
) -> None:
    root = parse(render_svg(CUT_CALL, small=small))
    assert root.tag == f"{SVG}svg"
    assert len(by_class(root, "event")) == 3 and len(by_class(root, "keepalive")) == 4
    assert len(by_class(root, "milestone")) == 3
    (cut,) = by_class(root, "cut")
    drawn = {line.get("class") for line in by_class(root, "deadline")}
    # flat and absolute are past the end of the chart (the cut, plus a margin): not drawn.
    assert drawn == {"deadline deadline-before_content", "deadline deadline-between_events"}
    (between,) = by_class(root, "deadline-between_events")
    # The cut is drawn where it happened: 3 ms after the deadline that ran out, later than it.
    assert x_of(cut) > x_of(between) >= max(x_of(e) for e in by_class(root, "keepalive"))
    assert not by_class(root, "end")


def test_the_large_picture_says_which_bound_cut_the_call_and_how_late() -> None:
    svg = render_svg(CUT_CALL)
    assert "between-events deadline 640 ms (cut the call)" in svg
    assert "cut at 643 ms, 3 ms after its deadline" in svg
    assert "before-content deadline 500 ms (met)" in svg
    assert "flat deadline 2.14 s (as it stood), off the chart" in svg
    assert "absolute deadline 2.5 s (as it stood), off the chart" in svg


def test_the_time_axis_scales_so_the_cut_stays_inside_the_chart() -> None:
    root = parse(render_svg(CUT_CALL))
    width = float(root.get("width") or 0)
    (cut,) = by_class(root, "cut")
    assert 0 < x_of(cut) < width - 20
    # Times scale linearly: event 140 ms sits at 140/40 of event 40 ms's distance from send.
    send = x_of(by_class(root, "milestone")[0])
    first, _, third = (x_of(e) - send for e in by_class(root, "event"))
    assert third / first == pytest.approx(140 / 40, rel=0.02)


def test_a_completed_call_has_an_end_and_no_cut() -> None:
    picture = CallPicture(
        outcome="completed", milestones=(Milestone(0, "send"),), events=(5.0, 9.0), end=10.0
    )
    root = parse(render_svg(picture))
    assert len(by_class(root, "end")) == 1 and not by_class(root, "cut")
    assert "ended (completed) at 10 ms" in render_svg(picture)


def test_events_left_out_between_the_first_and_the_last_are_counted_in_the_picture() -> None:
    picture = CallPicture(
        outcome="cut",
        events=tuple(float(i) for i in range(200)),
        events_tail=tuple(float(i) for i in range(950, 1000)),
        events_omitted=750,
        cut_at=1500.0,
        cut_lateness_ms=1.0,
    )
    root = parse(render_svg(picture))
    assert len(by_class(root, "event")) == 250
    (omitted,) = by_class(root, "omitted")
    assert omitted.text == "… 750 more …"
    assert "1000 model events" in render_svg(picture)  # the summary counts the left-out ones


def test_every_text_is_escaped() -> None:
    hostile = '<script>alert("x")</script> & "quoted"'
    picture = CallPicture(
        outcome=hostile,
        milestones=(Milestone(0, hostile),),
        deadlines=(DeadlineMark(hostile, 5),),
        notes=(hostile,),
        end=10.0,
    )
    for small in (False, True):
        svg = render_svg(picture, small=small)
        parse(svg)  # well-formed: nothing broke out of an attribute or an element
        assert "<script" not in svg
    root = parse(render_svg(picture))
    assert hostile in [e.text for e in root.iter() if e.tag == f"{SVG}text"]


def test_an_empty_call_renders_a_picture_without_dividing_by_zero() -> None:
    root = parse(render_svg(CallPicture(outcome="in flight", milestones=(Milestone(0, "send"),))))
    assert root.get("aria-label") == "call in flight"


def test_ticks_on_the_axis_are_round_numbers() -> None:
    texts = [e.text or "" for e in parse(render_svg(CUT_CALL)).iter() if e.tag == f"{SVG}text"]
    axis = [t for t in texts if re.fullmatch(r"\d+ ms", t)]
    assert axis[:4] == ["0 ms", "200 ms", "400 ms", "600 ms"]


@pytest.mark.parametrize(
    ("ms", "shown"),
    [
        (0, "0 ms"),
        (999, "999 ms"),
        (1000, "1 s"),
        (1250, "1.25 s"),
        (9999, "10 s"),
        (10_000, "10.0 s"),
        (119_999, "120.0 s"),
        (120_000, "2.0 min"),
        (4_500_000, "75.0 min"),
        (-3, "-3 ms"),
    ],
)
def test_durations_read_as_an_operator_reads_them(ms: float, shown: str) -> None:
    assert fmt_ms(ms) == shown
