"""Writing a call's timeline to its InferenceCall row, once the call has ended."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from agentops import rows
from inference.models import InferenceCall

from .bounds import BoundsSettings
from .client import CallResult, Timeline
from .config import bounds_settings


def ms_to_dt(ms: float | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def _offsets(marks: Iterable[float], sent: float) -> list[int]:
    return [round(m - sent) for m in marks]


def call_marks(t: Timeline, bounds: BoundsSettings | None) -> dict[str, Any]:
    """The call's recorded picture (``InferenceCall.marks``): when the model events and the
    keepalives arrived, in whole ms after send, the first and the last ones of each with the
    count left out between them, and the bounds the call ran under (None: bounds off)."""
    # The headers count as a keepalive in the counter (they prove the connection lives) but
    # have their own instant, not a mark.
    keepalives = t.keepalives - (1 if t.headers is not None else 0)
    return {
        "events": _offsets(t.event_marks, t.sent),
        "events_tail": _offsets(t.event_tail, t.sent),
        "events_omitted": max(0, t.model_events - len(t.event_marks) - len(t.event_tail)),
        "keepalives": _offsets(t.keepalive_marks, t.sent),
        "keepalives_tail": _offsets(t.keepalive_tail, t.sent),
        "keepalives_omitted": max(0, keepalives - len(t.keepalive_marks) - len(t.keepalive_tail)),
        "bounds": dataclasses.asdict(bounds) if bounds is not None else None,
    }


def call_fields(result: CallResult) -> dict[str, Any]:
    """What a call's row records of its result: the timeline, the outcome, the usage."""
    t = result.timeline
    return {
        "sent_at": ms_to_dt(t.sent),
        "headers_at": ms_to_dt(t.headers),
        "first_event_at": ms_to_dt(t.first_event),
        "first_content_at": ms_to_dt(t.first_content),
        "thinking_started_at": ms_to_dt(t.thinking_start),
        "last_event_at": ms_to_dt(t.last_event),
        "ended_at": ms_to_dt(t.ended),
        "model_events": t.model_events,
        "keepalives": t.keepalives,
        "outcome": result.outcome,
        "stop_reason": result.output.stop_reason if result.output else "",
        "bound": result.bound.value if result.bound else None,
        "bound_deadline": ms_to_dt(result.bound_deadline),
        "cut_lateness_ms": result.lateness_ms,
        "error": result.error.as_dict() if result.error else None,
        # Every caller runs the call under bounds_settings(): the bounds as they stood.
        "marks": call_marks(t, bounds_settings()),
        **result.usage.as_dict(),
    }


def call_record(call: InferenceCall, result: CallResult) -> None:
    """Write the ended call's result to its row (written before the call was sent)."""
    rows.update(InferenceCall, call.pk, **call_fields(result))
