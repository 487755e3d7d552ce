"""Writing a call's timeline to its InferenceCall row, once the call has ended."""

from __future__ import annotations

from datetime import UTC, datetime

from .client import CallResult
from .models import InferenceCall


def ms_to_dt(ms: float | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def call_record(call: InferenceCall, result: CallResult) -> None:
    t = result.timeline
    InferenceCall.objects.filter(pk=call.pk).update(
        sent_at=ms_to_dt(t.sent),
        headers_at=ms_to_dt(t.headers),
        first_event_at=ms_to_dt(t.first_event),
        first_content_at=ms_to_dt(t.first_content),
        thinking_started_at=ms_to_dt(t.thinking_start),
        last_event_at=ms_to_dt(t.last_event),
        ended_at=ms_to_dt(t.ended),
        model_events=t.model_events,
        keepalives=t.keepalives,
        outcome=result.outcome,
        stop_reason=result.output.stop_reason if result.output else "",
        bound=result.bound.value if result.bound else None,
        bound_deadline=ms_to_dt(result.bound_deadline),
        cut_lateness_ms=result.lateness_ms,
        error=result.error.as_dict() if result.error else None,
    )
