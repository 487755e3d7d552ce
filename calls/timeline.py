"""A recorded call as the values of its picture (``calls.timeline_svg``), with each bound's
deadline as it stood, computed by ``calls.bounds`` from the recorded instants and the
bounds the call ran under (``InferenceCall.marks``)."""

from __future__ import annotations

import math
from dataclasses import fields
from datetime import datetime
from typing import Any

from calls.bounds import BoundsSettings, CallState, bound_deadlines
from calls.config import bounds_settings
from calls.timeline_svg import CallPicture, DeadlineMark, Milestone, render_svg
from inference.models import InferenceCall


def _ms(at: datetime | None, sent: datetime) -> float | None:
    return None if at is None else (at - sent).total_seconds() * 1000


_BOUNDS_FIELDS = frozenset(f.name for f in fields(BoundsSettings))


def _finite(value: Any) -> float | None:
    """A stored value as a number, or None when it is not one (text, null, NaN, true...)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _settings(marks: dict[str, Any]) -> tuple[BoundsSettings | None, str | None]:
    """The bounds the call ran under, or (for a call recorded before marks were kept) the
    bounds in force now, with a note saying so.

    Stored marks outlive the code that wrote them, so they are read leniently: a field this
    version does not know, or a value that is not a usable number, is left out (and named in
    the note); a field the call did not record takes its default. A call's page never fails
    on what an older or newer version stored."""
    if "bounds" not in marks:
        return (
            bounds_settings(),
            "deadlines from the bounds in force now (this call recorded no bounds)",
        )
    raw = marks["bounds"]
    if raw is None:
        return None, None
    if not isinstance(raw, dict):
        return (
            bounds_settings(),
            "deadlines from the bounds in force now (this call's recorded bounds are unreadable)",
        )
    known: dict[str, float] = {}
    for name in _BOUNDS_FIELDS & raw.keys():
        value = _finite(raw[name])
        # A rate of 0 would divide by zero; no bound is negative.
        if value is not None and (value > 0 if name == "think_tokens_per_second" else value >= 0):
            known[name] = value
    notes = []
    if ignored := sorted(str(name)[:60] for name in raw if name not in known):
        notes.append(f"recorded bounds left out: {', '.join(ignored[:10])}")
    if defaulted := sorted(_BOUNDS_FIELDS - known.keys()):
        notes.append(f"defaults used for {', '.join(defaulted)}")
    return BoundsSettings(**known), "; ".join(notes) or None


def call_state(call: InferenceCall) -> CallState:
    """The reader's view of the call at its end, in ms after send (the bounds' input)."""
    assert call.sent_at is not None
    sent = call.sent_at
    thinking, last = _ms(call.thinking_started_at, sent), _ms(call.last_event_at, sent)
    return CallState(
        sent=0.0,
        streamed=call.streamed,
        max_tokens=call.max_tokens,
        thinking_start=thinking,
        first_content=_ms(call.first_content_at, sent),
        last_model_event=last,
        # The reader sets both instants from one model event when it starts a thinking block.
        last_event_was_thinking_start=thinking is not None and thinking == last,
    )


def call_deadlines(call: InferenceCall, settings: BoundsSettings) -> list[DeadlineMark]:
    """Each bound's deadline for the call as it stood at its end, in ms after send; for a
    streamed call that got content, also the before-content deadline it met."""
    assert call.sent_at is not None
    sent = call.sent_at
    state = call_state(call)
    thinking, first_content = state.thinking_start, state.first_content
    cut_by = call.bound if call.outcome == InferenceCall.Outcome.CUT else None
    marks: list[DeadlineMark] = []
    if call.streamed and first_content is not None:
        before = CallState(
            sent=0.0,
            streamed=True,
            max_tokens=call.max_tokens,
            thinking_start=thinking if thinking is not None and thinking < first_content else None,
        )
        met = bound_deadlines(before, settings)[0]
        marks.append(DeadlineMark(bound=met.bound.value, at=met.at, met=met.at >= first_content))
    for deadline in bound_deadlines(state, settings):
        recorded = _ms(call.bound_deadline, sent) if deadline.bound.value == cut_by else None
        at = recorded if recorded is not None else deadline.at  # the recorded one is what cut
        marks.append(
            DeadlineMark(bound=deadline.bound.value, at=at, cut=deadline.bound.value == cut_by)
        )
    if cut_by is not None and not any(m.cut for m in marks) and call.bound_deadline is not None:
        cut_ms = _ms(call.bound_deadline, sent)
        assert cut_ms is not None
        # Labelled by its stored name, which another version may have written.
        marks.append(DeadlineMark(bound=str(cut_by), at=cut_ms, cut=True))
    return sorted(marks, key=lambda m: m.at)


def call_picture(call: InferenceCall) -> CallPicture | None:
    """The picture's values for a recorded call; None for a call not sent yet."""
    if call.sent_at is None:
        return None
    sent = call.sent_at
    marks: dict[str, Any] = call.marks if isinstance(call.marks, dict) else {}
    settings, note = _settings(marks)
    milestones = [Milestone(0.0, "send")]
    for label, at in (
        ("headers", call.headers_at),
        ("thinking", call.thinking_started_at),
        ("first content", call.first_content_at),
    ):
        offset = _ms(at, sent)
        if offset is not None:
            milestones.append(Milestone(offset, label))
    cut_at = None
    if call.outcome == InferenceCall.Outcome.CUT and call.bound_deadline is not None:
        deadline = _ms(call.bound_deadline, sent)
        assert deadline is not None
        cut_at = deadline + (call.cut_lateness_ms or 0.0)
    notes = [note] if note and settings is not None else []
    if settings is None:
        notes.append("bounds were off for this call")

    def times(key: str) -> tuple[float, ...]:
        stored = marks.get(key)
        return (
            tuple(v for v in map(_finite, stored) if v is not None)
            if isinstance(stored, list)
            else ()
        )

    def count(key: str) -> int:
        return max(int(_finite(marks.get(key)) or 0), 0)

    return CallPicture(
        outcome=call.outcome or "in flight",
        milestones=tuple(milestones),
        events=times("events"),
        events_tail=times("events_tail"),
        events_omitted=count("events_omitted"),
        keepalives=times("keepalives"),
        keepalives_tail=times("keepalives_tail"),
        keepalives_omitted=count("keepalives_omitted"),
        deadlines=tuple(call_deadlines(call, settings)) if settings is not None else (),
        cut_at=cut_at,
        cut_lateness_ms=call.cut_lateness_ms if cut_at is not None else None,
        end=_ms(call.ended_at, sent),
        notes=tuple(notes),
    )


def call_timeline_svg(call: InferenceCall, *, small: bool = False) -> str:
    """The call's picture as SVG markup ("" for a call not sent yet)."""
    picture = call_picture(call)
    return render_svg(picture, small=small) if picture is not None else ""
