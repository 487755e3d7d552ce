"""Shedding (architecture.md §7.4): set aside the newest presented turn under one
``[refusal-rewind]`` marker note per run of failures, at most ``breaker_shed_cap`` times a run.

Lock order, everywhere: the agent row first (history writers hold it, see
``agentops.services.history_append``), then the breaker state row."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentops.models import Agent, HistoryRow
from agentops.services import history_append
from agentops.text import bound_text

from .models import BreakerState

logger = logging.getLogger(__name__)

MARKER_PREFIX = "[refusal-rewind]"
MARKER_PARTICIPANT = "agentops"
SHED_BY = "breaker"


@dataclass(frozen=True)
class ShedResult:
    """What a shed set aside (newest first), or why it stopped (``stopped`` is "cap" or "empty")."""

    rows: list[HistoryRow] = field(default_factory=list)
    marker: HistoryRow | None = None
    sheds_this_run: int = 0
    stopped: Literal["cap", "empty"] | None = None


def shed_cap() -> int:
    return int(settings.AGENTOPS_BREAKER_SHED_CAP)


def state_locked(agent_id: int) -> BreakerState:
    """The agent's breaker state, created if missing, locked until the transaction ends."""
    BreakerState.objects.get_or_create(agent_id=agent_id)
    return BreakerState.objects.select_for_update().get(agent_id=agent_id)


def sheddable_rows(agent: Agent) -> Any:
    return HistoryRow.objects.filter(agent=agent, state=HistoryRow.State.PRESENTED).exclude(
        role=HistoryRow.Role.SYSTEM_NOTE
    )


def _marker_text(count: int) -> str:
    return (
        f"{MARKER_PREFIX} The {count} most recent turn(s) were set aside "
        "because the model API kept refusing the requests that carried them. "
        "Their content is not repeated here. "
        "They stay in the record; an operator can restore them."
    )


def _rows_to_shed(agent: Agent) -> list[HistoryRow]:
    """The newest presented row that is not a system note; tool results go with the assistant
    row holding their tool calls just before them. Newest first."""
    rows: list[HistoryRow] = []
    for row in sheddable_rows(agent).order_by("-seq"):
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


def history_set_aside(*, row_ids: list[int], by: str, reason: str, now: Any) -> int:
    """Set presented rows aside (never deleted: an operator restores them, audited, through
    ``breaker.services`` as any set-aside row). Precondition: the agent's row lock is held.
    Returns how many rows moved."""
    return HistoryRow.objects.filter(pk__in=row_ids, state=HistoryRow.State.PRESENTED).update(
        state=HistoryRow.State.SET_ASIDE,
        set_aside_at=now,
        set_aside_by=by,
        set_aside_reason=bound_text(reason, 500),
    )


def shed_locked(*, agent: Agent, state: BreakerState, reason: str) -> ShedResult:
    """The shed itself. Precondition: inside a transaction holding the agent's row lock and
    then ``state``'s (so no history writer can move anything between a caller's checks and
    this). Logs after the commit."""
    now = timezone.now()
    cap = shed_cap()
    if state.sheds_this_run >= cap:
        transaction.on_commit(
            lambda: logger.warning(
                "breaker: agent %s model %s: not shedding, "
                "%d turn(s) already set aside in this run of failures (the cap); "
                "the history stays as it is until an operator looks (GET /agents/%s/breaker)",
                agent.name,
                agent.model,
                cap,
                agent.name,
            )
        )
        return ShedResult(sheds_this_run=state.sheds_this_run, stopped="cap")
    rows = _rows_to_shed(agent)
    if not rows:
        transaction.on_commit(
            lambda: logger.warning(
                "breaker: agent %s model %s: not shedding, nothing presented is left to set aside",
                agent.name,
                agent.model,
            )
        )
        return ShedResult(sheds_this_run=state.sheds_this_run, stopped="empty")
    history_set_aside(row_ids=[r.pk for r in rows], by=SHED_BY, reason=reason, now=now)
    state.sheds_this_run += 1
    text = _marker_text(state.sheds_this_run)
    marker = state.marker_row
    if marker is not None and HistoryRow.objects.filter(pk=marker.pk).exists():
        marker.content = text
        marker.edited_at = now
        marker.save(update_fields=["content", "edited_at"])
    else:
        marker = history_append(
            agent=agent,
            participant=MARKER_PARTICIPANT,
            role=HistoryRow.Role.SYSTEM_NOTE,
            content=text,
            note_kind=HistoryRow.NoteKind.SHED,
        )
    state.marker_row = marker
    state.save(update_fields=["sheds_this_run", "marker_row"])
    for row in rows:
        row.refresh_from_db()
    sheds = state.sheds_this_run
    transaction.on_commit(
        lambda: logger.warning(
            "[inference-rewind] agent %s model %s: set aside row(s) %s (%s); "
            "%d of %d shed(s) in this run",
            agent.name,
            agent.model,
            ", ".join(f"#{r.seq}" for r in rows),
            reason,
            sheds,
            cap,
        )
    )
    return ShedResult(rows=rows, marker=marker, sheds_this_run=sheds)


def history_shed(*, agent: Agent, reason: str) -> ShedResult:
    """Set aside the newest turn (architecture.md §7.4) and write or update the run's marker note,
    for a failure of a run whose history a probe already implicated.

    Stops, sets nothing aside and logs why at ``shed_cap`` sheds in this run or with nothing
    presented left to shed. The caller queues the one retry on a non-stopped result, in the
    same transaction when it has one open. A first shed after a probe goes through
    ``breaker.probes.breaker_probe_end``, which sheds under the same locks as its move check."""
    with transaction.atomic():
        agent = Agent.objects.select_for_update().get(pk=agent.pk)
        return shed_locked(agent=agent, state=state_locked(agent.pk), reason=reason)
