"""Reads of turns and calls, and of an agent's live state, for the API, admin and dashboard."""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch

from agentops.exceptions import NotFound
from agentops.models import Agent, ApiToken
from agentops.selectors import id_valid, visible_to

from .models import InferenceCall, Turn

_AGENT_STATUS: dict[str, str] = {
    Turn.Status.QUEUED: "queued",
    Turn.Status.RUNNING: "running",
    Turn.Status.HELD: "held",
    Turn.Status.REQUIRES_ACTION: "requires_action",
}


def agent_current_turn(agent: Agent) -> Turn | None:
    """The agent's open turn that is furthest along (running before held before queued)."""
    return current_turn_of(list(Turn.objects.filter(agent=agent, status__in=Turn.OPEN).order_by("id")))


def agent_open_turns() -> Prefetch:
    """``prefetch_related`` this on agents to read each one's ``open_turns`` (for
    ``current_turn_of``) in one query for the lot."""
    return Prefetch("turns", queryset=Turn.objects.filter(status__in=Turn.OPEN).order_by("id"), to_attr="open_turns")


def current_turn_of(open_turns: list[Turn]) -> Turn | None:
    """``agent_current_turn`` of turns already read: the agent's open turns in id order."""
    for status in (Turn.Status.RUNNING, Turn.Status.REQUIRES_ACTION, Turn.Status.HELD, Turn.Status.QUEUED):
        for turn in open_turns:
            if turn.status == status:
                return turn
    return None


def agent_failure_streak(agent: Agent) -> int:
    """Terminal failed turns in a row, reset by a completed call (kept by the breaker)."""
    from breaker.models import BreakerState

    return int(BreakerState.objects.filter(agent=agent).values_list("streak", flat=True).first() or 0)


def agent_out(agent: Agent) -> dict[str, Any]:
    current = agent_current_turn(agent)
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
        "status": _AGENT_STATUS.get(current.status, "idle") if current else "idle",
        "failure_streak": agent_failure_streak(agent),
        "holds": [],
        "current_turn": current.pk if current else None,
        "created_at": agent.created_at,
    }


def call_out(call: InferenceCall) -> dict[str, Any]:
    return {
        "id": call.pk,
        "kind": call.kind,
        "model": call.model,
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
    }


def turn_get(*, turn_id: int) -> Turn:
    turn = Turn.objects.select_related("agent", "note").filter(pk=turn_id).first() if id_valid(turn_id) else None
    if turn is None:
        raise NotFound(f"no turn with id {turn_id}", data={"field": "id"})
    return turn


def turn_for(*, token: ApiToken, turn_id: int) -> Turn:
    """``turn_get`` as ``token`` may see it: another project's turn is not found, exactly as an
    unknown id (see ``agentops.selectors.agent_for``)."""
    turn = turn_get(turn_id=turn_id)
    if not visible_to(token, turn.agent):
        raise NotFound(f"no turn with id {turn_id}", data={"field": "id"})
    return turn


def turn_out(turn: Turn) -> dict[str, Any]:
    return {
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
        "calls": [call_out(c) for c in turn.calls.order_by("id")],
        "created_at": turn.created_at,
        "ended_at": turn.ended_at,
    }
