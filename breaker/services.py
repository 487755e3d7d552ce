"""The breaker's writes (DESIGN §7): the failure streak and hard-down alert, the probe's life,
shedding history rows under one marker note per run, and restoring them.

Lock order, everywhere: the agent row first (history writers hold it, see
``inference.services.history_append``), then the breaker state row."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from django.conf import settings
from django.db import transaction
from django.db.models import Count, Max, Q
from django.utils import timezone

from agentops.alerts import alert_raise
from agentops.exceptions import Conflict, NotFound, bad_field
from agentops.models import Agent, AuditEntry, HistoryRow
from agentops.text import FAILURE_TEXT_LIMIT, bound_text, clean_requester
from inference.services import history_append

from .decision import BreakerAction, ProbeVerdict, breaker_decide
from .models import BreakerState

logger = logging.getLogger(__name__)

MARKER_PREFIX = "[refusal-rewind]"
MARKER_PARTICIPANT = "agentops"
SHED_BY = "breaker"
REQUESTER_LIMIT = 200

ProbeEndStatus = Literal["answered", "refused", "unclear", "set_aside", "aborted", "withdrawn"]


@dataclass(frozen=True)
class BreakerStep:
    """What one failure did to the breaker and what the caller should do next."""

    streak: int
    action: BreakerAction
    hard_down: bool


@dataclass(frozen=True)
class ProbeTicket:
    """The handle of one probe that is out. ``snapshot`` is what must not move while it is."""

    agent_id: int
    probe_id: uuid.UUID
    sent_at: datetime
    snapshot: dict[str, Any]


@dataclass(frozen=True)
class ShedResult:
    """What a shed set aside (newest first), or why it stopped (``stopped`` is "cap" or "empty")."""

    rows: list[HistoryRow] = field(default_factory=list)
    marker: HistoryRow | None = None
    sheds_this_run: int = 0
    stopped: Literal["cap", "empty"] | None = None


def _threshold() -> int:
    return int(settings.AGENTOPS_BREAKER_THRESHOLD)


def _shed_cap() -> int:
    return int(settings.AGENTOPS_BREAKER_SHED_CAP)


def _state_locked(agent_id: int) -> BreakerState:
    """The agent's breaker state, created if missing, locked until the transaction ends."""
    BreakerState.objects.get_or_create(agent_id=agent_id)
    return BreakerState.objects.select_for_update().get(agent_id=agent_id)


def _failure_text(failure_type: str, http_status: int | None) -> str:
    return f"{failure_type} at HTTP {http_status}" if http_status is not None else f"{failure_type} (no HTTP status)"


def _sheddable_rows(agent: Agent) -> Any:
    return HistoryRow.objects.filter(agent=agent, state=HistoryRow.State.PRESENTED).exclude(role=HistoryRow.Role.SYSTEM_NOTE)


def _hard_down_message(*, agent: Agent, streak: int, failure: str, action: BreakerAction) -> str:
    what = {
        BreakerAction.NOTHING: "This failure is not one that shedding history can help, so nothing was set aside.",
        BreakerAction.PROBE: "The breaker is sending the failed request without its history to see whether the history is the cause.",
        BreakerAction.SHED: "Its history is implicated (a probe without it was answered in this run), so the newest turn is being set aside.",
        BreakerAction.STOP_CAP: f"The breaker already set aside {_shed_cap()} turn(s) in this run, its cap, and stops shedding.",
        BreakerAction.STOP_EMPTY: "Nothing presented is left to set aside, so the breaker stops shedding.",
    }[action]
    return (
        f"Agent {agent.name} (model {agent.model}) failed {streak} turns in a row; the last failed with {failure}. "
        f"{what} Check the provider and the agent's configuration and the failures log; "
        f"GET /agents/{agent.name}/breaker shows the breaker and any rows it set aside."
    )


def breaker_note_failure(*, agent: Agent, failure_type: str, http_status: int | None) -> BreakerStep:
    """Count one terminal failed turn (DESIGN §7.1): the streak grows, a probe still out is
    withdrawn, and from the threshold on every failure raises a ``hard-down`` alert. The
    returned action is NOTHING below the threshold and for a disposed agent."""
    with transaction.atomic():
        state = _state_locked(agent.pk)
        state.streak += 1
        state.streak_version += 1
        if state.probe_status == BreakerState.ProbeStatus.OUT:
            state.probe_status = BreakerState.ProbeStatus.WITHDRAWN
            state.probe_verdict = "withdrawn: a later failure was counted while it was out"
        hard_down = state.streak >= _threshold()
        action = BreakerAction.NOTHING
        if hard_down and agent.disposed_at is None:
            action = breaker_decide(
                failure_type=failure_type,
                http_status=http_status,
                sheds_this_run=state.sheds_this_run,
                shed_cap=_shed_cap(),
                probe_answered_this_run=state.sheds_this_run > 0 or state.probe_status == BreakerState.ProbeStatus.ANSWERED,
                rows_left=_sheddable_rows(agent).exists(),
            )
        state.save()
        failure = _failure_text(failure_type, http_status)
        if hard_down:
            alert_raise(
                kind="hard-down", agent=agent.name, model=agent.model,
                message=_hard_down_message(agent=agent, streak=state.streak, failure=failure, action=action),
                data={"streak": state.streak, "failure_type": failure_type, "http_status": http_status, "action": action.value},
            )
    if action in (BreakerAction.STOP_CAP, BreakerAction.STOP_EMPTY):
        logger.warning(
            "breaker: agent %s model %s: %d failures in a row (%s); stopped shedding: %s",
            agent.name, agent.model, state.streak, failure,
            "at the shed cap" if action == BreakerAction.STOP_CAP else "nothing left to set aside",
        )
    return BreakerStep(streak=state.streak, action=action, hard_down=hard_down)


def breaker_note_success(*, agent: Agent) -> None:
    """A completed call ends the run of failures: the streak resets, the next run sheds afresh
    under a new marker note and probes again, and a probe still out no longer counts."""
    with transaction.atomic():
        state = BreakerState.objects.select_for_update().filter(agent_id=agent.pk).first()
        if state is None:
            return
        if state.streak != 0:
            state.streak = 0
            state.streak_version += 1
        state.sheds_this_run = 0
        state.marker_row = None
        state.probe_status = BreakerState.ProbeStatus.NONE
        state.save()


def _snapshot(agent_id: int, streak_version: int) -> dict[str, Any]:
    from inference.models import Turn  # a snapshot read only: breaker sits below the turn layer

    rows = HistoryRow.objects.filter(agent_id=agent_id).aggregate(
        newest=Max("id"),
        count=Count("id"),
        presented=Count("id", filter=Q(state=HistoryRow.State.PRESENTED)),
        edited=Count("id", filter=Q(edited_at__isnull=False)),
        set_aside=Count("id", filter=Q(state=HistoryRow.State.SET_ASIDE)),
        last_edit=Max("edited_at"),
        last_set_aside=Max("set_aside_at"),
    )
    agent = Agent.objects.filter(pk=agent_id).values("disposed_at").first()
    return {
        "newest_row_id": rows["newest"],
        "row_count": rows["count"],
        "presented_count": rows["presented"],
        "edited_count": rows["edited"],
        "set_aside_count": rows["set_aside"],
        "last_edit": rows["last_edit"].isoformat() if rows["last_edit"] else None,
        "last_set_aside": rows["last_set_aside"].isoformat() if rows["last_set_aside"] else None,
        "streak_version": streak_version,
        "newest_turn_id": Turn.objects.filter(agent_id=agent_id).aggregate(m=Max("id"))["m"],
        "disposed": agent is None or agent["disposed_at"] is not None,
    }


def breaker_probe_begin(*, agent: Agent) -> ProbeTicket:
    """Mark a probe out for the agent and remember what must not move while it is."""
    now = timezone.now()
    with transaction.atomic():
        state = _state_locked(agent.pk)
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
    ("streak_version", "the failure streak changed (even if back to the same number)"),
    ("newest_row_id", "a history row was added"),
    ("row_count", "a history row was added or removed"),
    ("presented_count", "a history row was set aside or restored"),
    ("set_aside_count", "a history row was set aside or restored"),
    ("last_set_aside", "a history row was set aside"),
    ("edited_count", "a history row was edited"),
    ("last_edit", "a history row was edited"),
    ("newest_turn_id", "another turn started"),
]


def _moved(ticket: ProbeTicket, state: BreakerState | None) -> str | None:
    if state is None or not Agent.objects.filter(pk=ticket.agent_id).exists():
        return "the agent was removed"
    if state.probe_id != ticket.probe_id or state.probe_status != BreakerState.ProbeStatus.OUT:
        return "the probe was withdrawn (a later failure or a completed call ended it)"
    now = _snapshot(ticket.agent_id, state.streak_version)
    for key, reason in _MOVES:
        if now.get(key) != ticket.snapshot.get(key):
            return reason
    return None


def breaker_probe_moved(*, ticket: ProbeTicket) -> str | None:
    """A human reason when anything moved while the probe was out (DESIGN §7.3), else None."""
    return _moved(ticket, BreakerState.objects.filter(agent_id=ticket.agent_id).first())


def breaker_probe_end(*, ticket: ProbeTicket, verdict: ProbeVerdict | Literal["aborted"], detail: str) -> ProbeEndStatus:
    """Record the probe's verdict and raise its alert; return what the caller acts on.

    Returns "answered" only when the probe was answered and nothing moved while it was out: then
    (and only then) the caller sheds with ``history_shed`` and queues one retry. When something
    moved the answer is set aside ("set_aside"): nothing is shed, no retry, the next failure
    decides. A probe already withdrawn stays "withdrawn". "refused" and "unclear" raise a
    ``history-kept`` alert, each verdict under its own cooldown key."""
    with transaction.atomic():
        agent = Agent.objects.select_for_update().filter(pk=ticket.agent_id).first()
        state = BreakerState.objects.select_for_update().filter(agent_id=ticket.agent_id).first()
        if agent is None or state is None:
            return "set_aside"
        if state.probe_id != ticket.probe_id or state.probe_status != BreakerState.ProbeStatus.OUT:
            logger.info("breaker: agent %s: a probe that was no longer out ended (%s); ignored", agent.name, verdict)
            return "withdrawn"
        status: ProbeEndStatus = verdict
        moved = _moved(ticket, state) if verdict != "aborted" else None
        if moved is not None:
            status = "set_aside"
            detail = f"set aside: {moved} while the probe was out; the answer was {verdict}: {detail}"
        state.probe_status = status
        state.probe_verdict = bound_text(detail, FAILURE_TEXT_LIMIT)
        state.save(update_fields=["probe_status", "probe_verdict"])
        if status == "refused" or status == "unclear":
            _raise_history_kept(agent=agent, verdict=status, detail=detail)
    if status == "set_aside":
        logger.warning(
            "[inference-rewind] agent %s model %s: the probe's answer was set aside because %s; "
            "nothing was shed and no retry was queued, the next failure decides", agent.name, agent.model, moved,
        )
    return status


def _raise_history_kept(*, agent: Agent, verdict: Literal["refused", "unclear"], detail: str) -> None:
    if verdict == "refused":
        message = (
            f"Agent {agent.name} (model {agent.model}) kept its history: the request fails without its history too "
            f"({detail}), so none of the history was shed. No retry was queued, so the agent tries again only when "
            "something next wakes it. Check the agent's configuration (model, max_tokens, tools) against the provider."
        )
    else:
        message = (
            f"Agent {agent.name} (model {agent.model}) kept its history: the probe couldn't tell whether the history "
            f"is the cause ({detail}). Nothing was shed and no retry was queued, so the agent tries again only when "
            "something next wakes it. Check the provider and the failures log."
        )
    logger.warning("[inference-rewind] %s", message)
    alert_raise(kind="history-kept", agent=agent.name, model=agent.model, verdict=verdict, message=message, data={"detail": bound_text(detail, 500)})


def _marker_text(count: int) -> str:
    return (
        f"{MARKER_PREFIX} The {count} most recent turn(s) were set aside because the model API kept refusing "
        "the requests that carried them. Their content is not repeated here. They stay in the record; an operator can restore them."
    )


def _rows_to_shed(agent: Agent) -> list[HistoryRow]:
    """The newest presented row that is not a system note; tool results go with the assistant
    row holding their tool calls just before them. Newest first."""
    rows: list[HistoryRow] = []
    for row in _sheddable_rows(agent).order_by("-seq"):
        if not rows:
            rows.append(row)
            if row.role != HistoryRow.Role.TOOL:
                break
            continue
        rows.append(row)
        if row.role != HistoryRow.Role.TOOL:
            break
    if len(rows) > 1 and rows[-1].role not in (HistoryRow.Role.TOOL, HistoryRow.Role.ASSISTANT):
        rows.pop()  # tool results with no tool call before them: shed only the results
    return rows


def history_shed(*, agent: Agent, reason: str) -> ShedResult:
    """Set aside the newest turn (DESIGN §7.4) and write or update the run's marker note.

    Stops, sets nothing aside and logs why at ``shed_cap`` sheds in this run or with nothing
    presented left to shed. The caller queues the one retry on a non-stopped result."""
    now = timezone.now()
    cap = _shed_cap()
    with transaction.atomic():
        agent = Agent.objects.select_for_update().get(pk=agent.pk)
        state = _state_locked(agent.pk)
        if state.sheds_this_run >= cap:
            logger.warning(
                "breaker: agent %s model %s: not shedding, %d turn(s) already set aside in this run of failures (the cap); "
                "the history stays as it is until an operator looks (GET /agents/%s/breaker)", agent.name, agent.model, cap, agent.name,
            )
            return ShedResult(sheds_this_run=state.sheds_this_run, stopped="cap")
        rows = _rows_to_shed(agent)
        if not rows:
            logger.warning(
                "breaker: agent %s model %s: not shedding, nothing presented is left to set aside", agent.name, agent.model,
            )
            return ShedResult(sheds_this_run=state.sheds_this_run, stopped="empty")
        HistoryRow.objects.filter(pk__in=[r.pk for r in rows]).update(
            state=HistoryRow.State.SET_ASIDE, set_aside_at=now, set_aside_by=SHED_BY,
            set_aside_reason=bound_text(reason, 500),
        )
        state.sheds_this_run += 1
        text = _marker_text(state.sheds_this_run)
        marker = state.marker_row
        if marker is not None and HistoryRow.objects.filter(pk=marker.pk).exists():
            marker.content = text
            marker.edited_at = now
            marker.save(update_fields=["content", "edited_at"])
        else:
            marker = history_append(agent=agent, participant=MARKER_PARTICIPANT, role=HistoryRow.Role.SYSTEM_NOTE, content=text)
        state.marker_row = marker
        state.save(update_fields=["sheds_this_run", "marker_row"])
        for row in rows:
            row.refresh_from_db()
    logger.warning(
        "[inference-rewind] agent %s model %s: set aside row(s) %s (%s); %d of %d shed(s) in this run",
        agent.name, agent.model, ", ".join(f"#{r.seq}" for r in rows), reason, state.sheds_this_run, cap,
    )
    return ShedResult(rows=rows, marker=marker, sheds_this_run=state.sheds_this_run)


def history_row_restore(*, agent_name: str, row_id: int, actor: str, requester: Any) -> HistoryRow:
    """Put a set-aside row back into the presented history, with an audit entry.

    Raises BadRequest naming ``requester`` when it is given and not a string, NotFound for an
    unknown agent or a row not in its history, Conflict when the row is not set aside."""
    if requester is not None and not isinstance(requester, str):
        raise bad_field("requester", "must be a string")
    who = clean_requester(requester, limit=REQUESTER_LIMIT) if requester else ""
    with transaction.atomic():
        agent = Agent.objects.select_for_update().filter(name=agent_name, disposed_at__isnull=True).first()
        if agent is None:
            raise NotFound(f"no agent named {agent_name!r}", data={"field": "name"})
        row = HistoryRow.objects.select_for_update().filter(agent=agent, pk=row_id).first()
        if row is None:
            raise NotFound(f"row_id: agent {agent_name!r} has no history row {row_id}", data={"field": "row_id"})
        if row.state != HistoryRow.State.SET_ASIDE:
            raise Conflict(f"history row {row_id} of agent {agent_name!r} is not set aside", data={"state": row.state})
        previous = {
            "set_aside_at": row.set_aside_at.isoformat() if row.set_aside_at else None,
            "set_aside_by": row.set_aside_by,
            "set_aside_reason": row.set_aside_reason,
        }
        row.state = HistoryRow.State.PRESENTED
        row.set_aside_at = None
        row.set_aside_by = ""
        row.set_aside_reason = ""
        row.save(update_fields=["state", "set_aside_at", "set_aside_by", "set_aside_reason"])
        AuditEntry.objects.create(
            actor=actor[:220], action="history.restore", target=f"agent:{agent.name}/history:{row.pk}",
            reason=who, data={"agent": agent.name, "row_id": row.pk, "seq": row.seq, "requester": who or None, **previous},
        )
    logger.warning("history row #%s of agent %s restored by %s%s", row.seq, agent.name, actor, f" for {who}" if who else "")
    return row
