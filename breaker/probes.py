"""The probe's life on the breaker's side (architecture.md §7.3): mark it out with a snapshot of
what must not move, read its verdict, and either shed (under the same locks as the move check, so
nothing can move between the two) or set its answer aside. The call itself is
``breaker.probe_call``'s.

Lock order, everywhere: the agent row first, then the breaker state row."""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from django.db import transaction
from django.db.models import Count, Max, Q, Sum
from django.utils import timezone

from agentops.alerts import alert_raise
from agentops.models import Agent, HistoryRow
from agentops.text import FAILURE_TEXT_LIMIT, bound_text
from inference.models import Turn

from .decision import ProbeVerdict
from .models import BreakerState
from .shedding import ShedResult, shed_locked, state_locked

logger = logging.getLogger(__name__)

ProbeEndStatus = Literal["answered", "refused", "unclear", "set_aside", "aborted", "withdrawn"]

# What a PATCH of the agent changes: a probe of the old configuration says nothing of the new.
_CONFIG_FIELDS = (
    "provider_id",
    "model",
    "participant",
    "system",
    "max_tokens",
    "thinking_budget",
    "stream",
    "tools",
    "disposed_at",
)


@dataclass(frozen=True)
class ProbeTicket:
    """The handle of one probe that is out. ``snapshot`` is what must not move while it is."""

    agent_id: int
    probe_id: uuid.UUID
    sent_at: datetime
    snapshot: dict[str, Any]


@dataclass(frozen=True)
class ProbeEnd:
    """How a probe ended, and the shed its answer led to (only for ``answered``)."""

    status: ProbeEndStatus
    shed: ShedResult | None = None


def _snapshot(agent_id: int, streak_version: int) -> dict[str, Any]:
    rows = HistoryRow.objects.filter(agent_id=agent_id).aggregate(
        newest=Max("id"),
        count=Count("id"),
        presented=Count("id", filter=Q(state=HistoryRow.State.PRESENTED)),
        edited=Count("id", filter=Q(edited_at__isnull=False)),
        set_aside=Count("id", filter=Q(state=HistoryRow.State.SET_ASIDE)),
        last_edit=Max("edited_at"),
        last_set_aside=Max("set_aside_at"),
    )
    turns = Turn.objects.filter(agent_id=agent_id).aggregate(
        newest=Max("id"), claims=Sum("attempts")
    )
    agent = Agent.objects.filter(pk=agent_id).values(*_CONFIG_FIELDS).first()
    config = (
        hashlib.sha256(json.dumps(agent, sort_keys=True, default=str).encode()).hexdigest()
        if agent
        else None
    )
    return {
        "newest_row_id": rows["newest"],
        "row_count": rows["count"],
        "presented_count": rows["presented"],
        "edited_count": rows["edited"],
        "set_aside_count": rows["set_aside"],
        "last_edit": rows["last_edit"].isoformat() if rows["last_edit"] else None,
        "last_set_aside": rows["last_set_aside"].isoformat() if rows["last_set_aside"] else None,
        "streak_version": streak_version,
        "newest_turn_id": turns["newest"],
        "turn_claims": turns["claims"] or 0,
        "disposed": agent is None or agent["disposed_at"] is not None,
        "config": config,
    }


def breaker_probe_begin(*, agent: Agent) -> ProbeTicket:
    """Mark a probe out for the agent and remember what must not move while it is."""
    now = timezone.now()
    with transaction.atomic():
        state = state_locked(agent.pk)
        probe_id = uuid.uuid4()
        snapshot = _snapshot(agent.pk, state.streak_version)
        state.probe_status = BreakerState.ProbeStatus.OUT
        state.probe_id = probe_id
        state.probe_sent_at = now
        state.probe_verdict = ""
        state.probe_snapshot = snapshot
        state.save()
    return ProbeTicket(agent_id=agent.pk, probe_id=probe_id, sent_at=now, snapshot=snapshot)


_MOVES: list[tuple[str, str]] = [
    ("disposed", "the agent was disposed"),
    ("config", "the agent was replaced (its configuration changed)"),
    ("streak_version", "the failure streak changed (even if back to the same number)"),
    ("newest_row_id", "a history row was added"),
    ("row_count", "a history row was added or removed"),
    ("presented_count", "a history row was set aside or restored"),
    ("set_aside_count", "a history row was set aside or restored"),
    ("last_set_aside", "a history row was set aside"),
    ("edited_count", "a history row was edited"),
    ("last_edit", "a history row was edited"),
    ("newest_turn_id", "another turn started"),
    ("turn_claims", "another turn started"),
]


def _moved(ticket: ProbeTicket, state: BreakerState | None) -> str | None:
    if state is None or not Agent.objects.filter(pk=ticket.agent_id).exists():
        return "the agent was removed"
    if state.probe_id != ticket.probe_id or state.probe_status != BreakerState.ProbeStatus.OUT:
        return (
            "the probe was withdrawn "
            "(a later failure, a completed call or the agent's removal ended it)"
        )
    now = _snapshot(ticket.agent_id, state.streak_version)
    for key, reason in _MOVES:
        if now.get(key) != ticket.snapshot.get(key):
            return reason
    return None


def breaker_probe_moved(*, ticket: ProbeTicket) -> str | None:
    """A human reason when anything moved while the probe was out (architecture.md §7.3), else
    None."""
    return _moved(ticket, BreakerState.objects.filter(agent_id=ticket.agent_id).first())


def breaker_probe_end(
    *,
    ticket: ProbeTicket,
    verdict: ProbeVerdict | Literal["aborted"],
    detail: str,
    shed_reason: str,
) -> ProbeEnd:
    """Record the probe's verdict, raise its alert, and shed when the answer stands.

    An answer stands only when the probe was answered and nothing moved while it was out;
    then the newest turn is shed in this same transaction, under the agent's and the state's
    locks taken before the move check, so no history writer can slip in between. The caller
    queues the one retry for a shed that did not stop, inside its own transaction around this
    call when it has one. When something moved the answer is set aside ("set_aside"): nothing
    is shed, no retry, the next failure decides. A probe already withdrawn stays "withdrawn".
    "refused", "unclear" and "aborted" raise a ``history-kept`` alert, each verdict (refused,
    or couldn't tell) under its own webhook cooldown key."""
    with transaction.atomic():
        agent = Agent.objects.select_for_update().filter(pk=ticket.agent_id).first()
        state = BreakerState.objects.select_for_update().filter(agent_id=ticket.agent_id).first()
        if agent is None or state is None:
            return ProbeEnd("set_aside")
        if state.probe_id != ticket.probe_id or state.probe_status != BreakerState.ProbeStatus.OUT:
            logger.info(
                "breaker: agent %s: a probe that was no longer out ended (%s); ignored",
                agent.name,
                verdict,
            )
            return ProbeEnd("withdrawn")
        status: ProbeEndStatus = verdict
        moved = _moved(ticket, state)
        if moved is not None:
            status = "set_aside"
            detail = (
                f"set aside: {moved} while the probe was out; the answer was {verdict}: {detail}"
            )
        state.probe_status = status
        state.probe_verdict = bound_text(detail, FAILURE_TEXT_LIMIT)
        state.save(update_fields=["probe_status", "probe_verdict"])
        if status in ("refused", "unclear", "aborted"):
            _raise_history_kept(agent=agent, refused=status == "refused", detail=detail)
        shed = (
            shed_locked(agent=agent, state=state, reason=shed_reason)
            if status == "answered"
            else None
        )
    if status == "set_aside":
        logger.warning(
            "[inference-rewind] agent %s model %s: the probe's answer was set aside because %s; "
            "nothing was shed and no retry was queued, the next failure decides",
            agent.name,
            agent.model,
            moved,
        )
    return ProbeEnd(status, shed)


def _raise_history_kept(*, agent: Agent, refused: bool, detail: str) -> None:
    if refused:
        message = (
            f"Agent {agent.name} (model {agent.model}) kept its history: "
            f"the request fails without its history too ({detail}), "
            "so none of the history was shed. "
            "No retry was queued, so the agent tries again only when something next wakes it. "
            "Check the agent's configuration (model, max_tokens, tools) against the provider."
        )
    else:
        message = (
            f"Agent {agent.name} (model {agent.model}) kept its history: "
            f"the probe couldn't tell whether the history is the cause ({detail}). "
            "Nothing was shed and no retry was queued, so the agent tries again only when "
            "something next wakes it. Check the provider and the failures log."
        )
    # On commit: the line says what the committed state is, not what a rollback undid.
    transaction.on_commit(lambda: logger.warning("[inference-rewind] %s", message))
    alert_raise(
        kind="history-kept",
        agent=agent.name,
        model=agent.model,
        verdict="refused" if refused else "unclear",
        message=message,
        data={"detail": bound_text(detail, 500)},
    )
