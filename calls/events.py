"""A call's live events for the operator dashboard (architecture.md §9): ``call.started`` and
``call.ended``, sent through ``agentops.live.dashboard_publish`` (which lists every event type),
and the shape of an in-flight call that the dashboard's snapshot shows too.

Instants are milliseconds since the epoch (``*_ms``): the page counts down against them with
the browser's clock, corrected by the server's ``now_ms`` in each snapshot.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from agentops.live import dashboard_publish
from calls.bounds import FIXED_BOUNDS, CallState, bound_deadlines, next_deadline
from calls.client import CallResult
from calls.config import bounds_settings
from inference.models import InferenceCall


def _ms(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp() * 1000


def call_deadline_ms(*, sent_ms: float, streamed: bool, max_tokens: int | None) -> dict[str, Any]:
    """The call's nearest deadline as of its send (``deadline_ms``, ``bound``), and the
    last one no model event can move (``final_ms``, ``final_bound``). All None when the bounds
    are off. A streamed call that gets content moves past its first deadline: the page then
    counts down to the final one."""
    bounds = bounds_settings()
    state = CallState(sent=sent_ms, streamed=streamed, max_tokens=max_tokens)
    first = next_deadline(state, bounds)
    if bounds is None or first is None:
        return {"deadline_ms": None, "bound": None, "final_ms": None, "final_bound": None}
    final = next(d for d in bound_deadlines(state, bounds) if d.bound in FIXED_BOUNDS)
    return {
        "deadline_ms": first.at,
        "bound": first.bound.value,
        "final_ms": final.at,
        "final_bound": final.bound.value,
    }


def call_live_out(call: InferenceCall, *, agent: str) -> dict[str, Any]:
    """An in-flight call as the dashboard shows it. Reads no other row."""
    sent_ms = _ms(call.sent_at) or time.time() * 1000
    return {
        "id": call.pk,
        "agent": agent,
        "model": call.model,
        "kind": call.kind,
        "turn": call.turn_id,
        "streamed": call.streamed,
        "since_ms": sent_ms,
        **call_deadline_ms(sent_ms=sent_ms, streamed=call.streamed, max_tokens=call.max_tokens),
    }


def dashboard_call_started(*, call: InferenceCall, agent: str) -> None:
    """``call.started``: one small message per call, built from the row in hand."""
    dashboard_publish({"type": "call.started", "call": call_live_out(call, agent=agent)})


def dashboard_call_ended(*, call: InferenceCall, agent: str, result: CallResult) -> None:
    """``call.ended`` with the call's outcome, its token usage (each count null when not
    reported) and, for a cut, its bound and lateness."""
    dashboard_publish(
        {
            "type": "call.ended",
            "call": {
                "id": call.pk,
                "agent": agent,
                "model": call.model,
                "kind": call.kind,
                "outcome": result.outcome,
                "bound": result.bound.value if result.bound else None,
                "cut_lateness_ms": result.lateness_ms,
                "ended_ms": result.timeline.ended or time.time() * 1000,
                "usage": result.usage.as_dict(),
            },
        }
    )
