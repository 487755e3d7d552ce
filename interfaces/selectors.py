"""Reads of turns and calls, and of an agent's live state, for the API, admin and dashboard."""

from __future__ import annotations

import time
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Prefetch
from django.utils import timezone

from agentops.exceptions import NotFound
from agentops.models import Agent, ApiToken
from agentops.prices import decimal_text
from agentops.selectors import id_valid, visible_to
from calls.pacing import Pacer
from calls.progress import call_progress_read
from calls.records import ms_to_dt
from inference.models import InferenceCall, Turn
from turns.context.selectors import context_out, last_input_tokens
from turns.routing import alternates
from turns.serving_reads import pool_out, serving_out
from waits.clock import clock_ms
from waits.selectors import binding_waits

_AGENT_STATUS: dict[str, str] = {
    Turn.Status.QUEUED: "queued",
    Turn.Status.RUNNING: "running",
    Turn.Status.HELD: "held",
    Turn.Status.REQUIRES_ACTION: "requires_action",
}


def agent_current_turn(agent: Agent) -> Turn | None:
    """The agent's open turn that is furthest along (running before held before queued)."""
    return current_turn_of(
        list(Turn.objects.filter(agent=agent, status__in=Turn.OPEN).order_by("id"))
    )


def agent_open_turns() -> Prefetch:
    """``prefetch_related`` this on agents to read each one's ``open_turns`` (for
    ``current_turn_of``) in one query for the lot."""
    return Prefetch(
        "turns",
        queryset=Turn.objects.filter(status__in=Turn.OPEN).order_by("id"),
        to_attr="open_turns",
    )


def current_turn_of(open_turns: list[Turn]) -> Turn | None:
    """``agent_current_turn`` of turns already read: the agent's open turns in id order."""
    for status in (
        Turn.Status.RUNNING,
        Turn.Status.REQUIRES_ACTION,
        Turn.Status.HELD,
        Turn.Status.QUEUED,
    ):
        for turn in open_turns:
            if turn.status == status:
                return turn
    return None


def agent_failure_streak(agent: Agent) -> int:
    """Terminal failed turns in a row, reset by a completed call (kept by the breaker)."""
    from breaker.models import BreakerState

    return int(
        BreakerState.objects.filter(agent=agent).values_list("streak", flat=True).first() or 0
    )


def agent_status_of(current: Turn | None) -> str:
    """The agent's ``status`` in API.md's words, from ``agent_current_turn``."""
    return _AGENT_STATUS.get(current.status, "idle") if current else "idle"


def agent_holds(agent: Agent) -> list[dict[str, Any]]:
    """The waits that bind the agent now, in ``GET /waits``'s shape."""
    return binding_waits(agent=agent.name, now_ms=clock_ms())[1]


def agents_out(
    pacer: Pacer, *, token: ApiToken, status: str | None = None, project: str | None = None
) -> list[dict[str, Any]]:
    """Every live agent ``token`` may see in ``agent_out``'s shape, by name, optionally only
    those whose ``status`` is ``status`` and those of the project named ``project``: one read
    of the binding waits and of open turns for the lot. ``pacer``: the process's, whose quotas
    routing reads."""
    from breaker.models import BreakerState

    found = Agent.objects.select_related("provider", "project").filter(disposed_at__isnull=True)
    if not token.operator:
        found = found.filter(project=token.project)
    if project is not None:
        found = found.filter(project__name=project)
    agents = list(found.prefetch_related(agent_open_turns()).order_by("name"))
    streaks = dict(BreakerState.objects.filter(agent__in=agents).values_list("agent_id", "streak"))
    by_agent: dict[str, list[dict[str, Any]]] = {}
    for wait in binding_waits(now_ms=clock_ms())[1]:
        by_agent.setdefault(wait["agent"], []).append(wait)
    inputs = last_input_tokens(a.pk for a in agents)
    out = []
    for agent in agents:
        current = current_turn_of(agent.open_turns)  # type: ignore[attr-defined]
        if status is not None and agent_status_of(current) != status:
            continue
        out.append(
            agent_out(
                pacer,
                agent,
                current=current,
                streak=int(streaks.get(agent.pk) or 0),
                holds=by_agent.get(agent.name, []),
                last_input=inputs.get(agent.pk),
            )
        )
    return out


_UNSET: Any = object()


def agent_out(
    pacer: Pacer,
    agent: Agent,
    *,
    current: Turn | None = _UNSET,
    streak: int | None = None,
    holds: list[dict[str, Any]] | None = None,
    last_input: int | None = _UNSET,
) -> dict[str, Any]:
    if current is _UNSET:
        current = agent_current_turn(agent)
    if last_input is _UNSET:
        last_input = last_input_tokens([agent.pk]).get(agent.pk)
    return {
        "name": agent.name,
        "project": agent.project.name,
        "kind": agent.kind,
        "provider": agent.provider.name,
        "model": agent.model,
        "participant": agent.participant,
        "system": agent.system,
        "max_tokens": agent.max_tokens,
        "thinking_budget": agent.thinking_budget,
        "stream": agent.stream,
        "tools": agent.tools,
        "fallbacks": [
            {k: f.get(k) for k in ("provider", "model", "context_window")}
            for f in alternates(agent.fallbacks)
        ],
        "pool": pool_out(pacer, agent, time.time() * 1000) if alternates(agent.pool) else [],
        "hedge_after_ms": agent.hedge_after_ms,
        "serving": agent_serving(pacer, agent),
        "status": agent_status_of(current),
        "failure_streak": agent_failure_streak(agent) if streak is None else streak,
        "holds": agent_holds(agent) if holds is None else holds,
        "current_turn": current.pk if current else None,
        "created_at": agent.created_at,
        "context": context_out(agent, last_input),
    }


def call_out(call: InferenceCall, *, progress: dict[str, Any] | None = None) -> dict[str, Any]:
    """A call as API.md shapes it. For a call in flight, ``progress`` (its live entry,
    ``calls.progress``) gives the counts so far and ``next_deadline``/``next_bound``."""
    out = {
        "id": call.pk,
        "kind": call.kind,
        "model": call.model,
        "provider": call.provider.name if call.provider is not None else None,
        "route": call.route,
        "route_kind": call.route_kind,
        "streamed": call.streamed,
        "sent_at": call.sent_at,
        "first_event_at": call.first_event_at,
        "first_content_at": call.first_content_at,
        "last_event_at": call.last_event_at,
        "ended_at": call.ended_at,
        "model_events": call.model_events,
        "keepalives": call.keepalives,
        "outcome": call.outcome,
        "bound": call.bound,
        "bound_deadline": call.bound_deadline,
        "cut_lateness_ms": call.cut_lateness_ms,
        "error": call.error,
        "usage": call_usage(call),
        "cost": decimal_text(call.cost),
        "cost_basis": call.cost_basis or None,
        "price_id": call.price_id,
        "next_deadline": None,
        "next_bound": None,
    }
    if progress is not None and call.ended_at is None:
        out.update(
            {
                "first_event_at": _dt(progress.get("first_event_ms")),
                "first_content_at": _dt(progress.get("first_content_ms")),
                "last_event_at": _dt(progress.get("last_event_ms")),
                "model_events": int(progress.get("model_events") or 0),
                "keepalives": int(progress.get("keepalives") or 0),
                "next_deadline": _dt(progress.get("deadline_ms")),
                "next_bound": progress.get("bound"),
            }
        )
    return out


def _dt(ms: Any) -> Any:
    return ms_to_dt(ms) if isinstance(ms, int | float) else None


def _calls_out(calls: list[InferenceCall]) -> list[dict[str, Any]]:
    live = call_progress_read([c.pk for c in calls if c.ended_at is None])
    return [call_out(c, progress=live.get(c.pk)) for c in calls]


def turn_get(*, turn_id: int) -> Turn:
    turn = (
        Turn.objects.select_related("agent", "note").filter(pk=turn_id).first()
        if id_valid(turn_id)
        else None
    )
    if turn is None:
        raise NotFound(f"no turn with id {turn_id}", data={"field": "turn_id"})
    return turn


def turn_waiting(turn: Turn, *, now: datetime | None = None) -> tuple[datetime | None, str]:
    """Until when an open turn's next call waits, and why (``pacing after a 429``, ``retry 2 of
    3 after server error``, ``re-armed``): from ``Turn.not_before``, the instant the drain kept
    before the wait. (None, "") when it does not wait."""
    now = now or timezone.now()
    if turn.status not in Turn.OPEN or turn.not_before is None or turn.not_before <= now:
        return None, ""
    return turn.not_before, turn.waiting_reason or "pacing"


def turns_waiting(*, now: datetime, limit: int = 300) -> list[dict[str, Any]]:
    """The open turns whose next call waits, soonest first (the dashboard's snapshot)."""
    rows = (
        Turn.objects.filter(status__in=Turn.OPEN, not_before__gt=now)
        .select_related("agent")
        .order_by("not_before")[:limit]
    )
    return [
        {
            "turn": t.pk,
            "agent": t.agent.name,
            "status": t.status,
            "waiting_until_ms": t.not_before.timestamp() * 1000,
            "waiting_reason": turn_waiting(t, now=now)[1],
        }
        for t in rows
        if t.not_before is not None
    ]


def turn_for(*, token: ApiToken, turn_id: int) -> Turn:
    """``turn_get`` as ``token`` may see it: another project's turn is not found, exactly as an
    unknown id (see ``agentops.selectors.agent_for``)."""
    turn = turn_get(turn_id=turn_id)
    if not visible_to(token, turn.agent):
        raise NotFound(f"no turn with id {turn_id}", data={"field": "turn_id"})
    return turn


def turn_out(turn: Turn) -> dict[str, Any]:
    waiting_until, waiting_reason = turn_waiting(turn)
    calls = list(turn.calls.select_related("provider").order_by("id"))
    return {
        "waiting_until": waiting_until,
        "waiting_reason": waiting_reason or None,
        "id": turn.pk,
        "agent": turn.agent.name,
        "status": turn.status,
        "held_until": turn.hold_until,
        "hold_reason": turn.hold_reason,
        "attempts": turn.attempts,
        "rounds": turn.rounds,
        "output": turn.output,
        "note": turn.note.content if turn.note else None,
        "error": turn.error,
        "pending_tool_calls": turn.pending_tool_calls,
        "calls": _calls_out(calls),
        "cost": decimal_text(turn_cost(calls)),
        "served_by": _served_by(calls[-1]) if calls else None,
        "created_at": turn.created_at,
        "ended_at": turn.ended_at,
    }


def turn_cost(calls: list[InferenceCall]) -> Decimal | None:
    """The sum of the turn's ended calls' costs; None when any of them has none (unpriced, or
    usage unreported): a partial sum would read as the whole (architecture.md §17)."""
    total = Decimal(0)
    for call in calls:
        if call.outcome is None:
            continue  # in flight: it has cost nothing yet
        if call.cost is None:
            return None
        total += call.cost
    return total


def _served_by(call: InferenceCall) -> dict[str, Any]:
    return {"provider": call.provider.name if call.provider else None, "model": call.model}


def agent_serving(pacer: Pacer, agent: Agent) -> dict[str, Any] | None:
    """The alternate that serves the agent's next call and why (architecture.md §6.11), or
    None when its own provider and model do."""
    serving = serving_out(pacer, agent, clock_ms())
    if serving is None:
        return None
    return {**serving, "primary_until": _dt(serving["primary_until"])}


def call_usage(call: InferenceCall) -> dict[str, int | None]:
    """The call's token usage as reported; each count None when the provider reported none."""
    return {
        "input_tokens": call.input_tokens,
        "output_tokens": call.output_tokens,
        "reasoning_tokens": call.reasoning_tokens,
        "cached_input_tokens": call.cached_input_tokens,
        "cache_write_tokens": call.cache_write_tokens,
    }
