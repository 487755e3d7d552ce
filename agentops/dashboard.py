"""The live operator dashboard's data (DESIGN §9): its snapshot and its live events.

Every event goes to the Channels group ``dashboard`` as ``{"type": "dashboard.event",
"event": {...}}`` through ``agentops.live.dashboard_publish``;
``agentops.consumers.DashboardConsumer`` forwards the inner event as is. Event types:
``snapshot`` (sent by the consumer on connect and on request), ``alert.raised`` (sent by
``agentops.alerts``, the alert as ``agentops.selectors.alert_json``), ``call.started``,
``call.ended``, ``hold.started``, ``hold.ended``. Producers call one function each; the event
goes out once the current transaction commits, from the process's background loop, so the
caller never waits on Redis.

Instants are sent as milliseconds since the epoch (``*_ms``): the page counts down against
them with the browser's clock, corrected by the server's ``now_ms`` in each snapshot.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db.models import Count, Q

from .live import dashboard_publish
from .models import Agent, Alert, HistoryRow
from .selectors import alert_json
from .text import bound_text

if TYPE_CHECKING:
    from inference.client import CallResult
    from inference.models import InferenceCall

SNAPSHOT_CALLS = 200
SNAPSHOT_AGENTS = 300
SNAPSHOT_ALERTS = 25
REASON_LIMIT = 300  # a hold's reason as the page shows it


def _ms(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp() * 1000


# --- calls ----------------------------------------------------------------------------------


def call_deadline_ms(*, sent_ms: float, streamed: bool, max_tokens: int | None) -> dict[str, Any]:
    """The call's nearest deadline as of its send (``deadline_ms``, ``bound``), and the
    last one no model event can move (``final_ms``, ``final_bound``). All None when the bounds
    are off. A streamed call that gets content moves past its first deadline: the page then
    counts down to the final one."""
    from inference.bounds import FIXED_BOUNDS, CallState, bound_deadlines, next_deadline
    from inference.config import bounds_settings

    bounds = bounds_settings()
    state = CallState(sent=sent_ms, streamed=streamed, max_tokens=max_tokens)
    first = next_deadline(state, bounds)
    if bounds is None or first is None:
        return {"deadline_ms": None, "bound": None, "final_ms": None, "final_bound": None}
    final = next(d for d in bound_deadlines(state, bounds) if d.bound in FIXED_BOUNDS)
    return {"deadline_ms": first.at, "bound": first.bound.value, "final_ms": final.at, "final_bound": final.bound.value}


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
    """``call.ended`` with the call's outcome and, for a cut, its bound and lateness."""
    dashboard_publish({
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
        },
    })


# --- holds ----------------------------------------------------------------------------------


def hold_out(*, agent: str, model: str, until_ms: float | None, reason: str, set_at_ms: float | None, source: str) -> dict[str, Any]:
    return {
        "agent": agent,
        "model": model,
        "until_ms": until_ms,
        "reason": bound_text(reason, REASON_LIMIT),
        "set_at_ms": set_at_ms,
        "source": source,
    }


def dashboard_hold_started(*, agent: str, model: str, until_ms: float | None, reason: str, set_at_ms: float, source: str) -> None:
    """``hold.started``: a wait now binds (agent, model), until ``until_ms`` (None: until
    released). A longer wait replacing a shorter one is a new start for the same pair."""
    dashboard_publish({
        "type": "hold.started",
        "hold": hold_out(agent=agent, model=model, until_ms=until_ms, reason=reason, set_at_ms=set_at_ms, source=source),
    })


def dashboard_hold_ended(*, agent: str, model: str, why: str) -> None:
    """``hold.ended``: an operator released the wait. (A hold that simply runs out is ended by
    the page itself at its ``until_ms``.)"""
    dashboard_publish({"type": "hold.ended", "hold": {"agent": agent, "model": model, "why": bound_text(why, REASON_LIMIT)}})


# --- the snapshot ---------------------------------------------------------------------------


def dashboard_snapshot(*, now_ms: float) -> dict[str, Any]:
    """Everything the page shows, read now: in-flight calls, binding holds, each agent's
    breaker and the newest alerts. A fixed handful of queries whatever the number of rows."""
    from waits.selectors import binding_waits

    readable, waits = binding_waits(now_ms=now_ms)
    return {
        "type": "snapshot",
        "now_ms": now_ms,
        "calls": _calls_in_flight(),
        "holds": [
            hold_out(
                agent=w["agent"], model=w["model"], until_ms=_ms(w["until"]), reason=w["reason"],
                set_at_ms=_ms(w["set_at"]), source=w["source"],
            )
            for w in waits
        ],
        "journal_readable": readable,
        "breakers": _breakers(),
        "alerts": [alert_json(a) for a in Alert.objects.order_by("-id")[:SNAPSHOT_ALERTS]],
    }


def _calls_in_flight() -> list[dict[str, Any]]:
    from inference.models import InferenceCall

    rows = InferenceCall.objects.filter(outcome__isnull=True).select_related("agent").order_by("id")[:SNAPSHOT_CALLS]
    return [call_live_out(call, agent=call.agent.name) for call in rows]


def _breakers() -> list[dict[str, Any]]:
    """Each live agent's breaker, agents in trouble first (longest streak, then name)."""
    from breaker.models import BreakerState

    agents = list(
        Agent.objects.filter(disposed_at__isnull=True)
        .annotate(set_aside=Count("history", filter=Q(history__state=HistoryRow.State.SET_ASIDE)))
        .values("id", "name", "model", "kind", "set_aside")
        .order_by("name")[:SNAPSHOT_AGENTS]
    )
    states = {s.agent_id: s for s in BreakerState.objects.filter(agent_id__in=[a["id"] for a in agents])}
    out = []
    for a in agents:
        state = states.get(a["id"])
        probe = None
        if state is not None and state.probe_status:
            probe = {"status": state.probe_status, "sent_ms": _ms(state.probe_sent_at), "verdict": bound_text(state.probe_verdict, REASON_LIMIT) or None}
        out.append({
            "agent": a["name"],
            "model": a["model"],
            "kind": a["kind"],
            "streak": state.streak if state else 0,
            "threshold": int(settings.AGENTOPS_BREAKER_THRESHOLD),
            "sheds_this_run": state.sheds_this_run if state else 0,
            "shed_cap": int(settings.AGENTOPS_BREAKER_SHED_CAP),
            "probe": probe,
            "set_aside": a["set_aside"],
        })
    out.sort(key=lambda b: (-b["streak"], b["probe"] is None, b["agent"]))
    return out

