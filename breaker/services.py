"""The breaker's writes (architecture.md §7): the failure streak and hard-down alert, withdrawing a
probe that is out, and restoring set-aside rows. The probe's life is in ``breaker.probes``,
shedding in ``breaker.shedding``.

Lock order, everywhere: the agent row first (history writers hold it, see
``agentops.services.history_append``), then the breaker state row."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from django.db import transaction

from agentops import rows, telemetry
from agentops.alerts import alert_raise
from agentops.cancels import abort_signal
from agentops.exceptions import Conflict, NotFound, bad_field
from agentops.models import Agent, AuditEntry, HistoryRow
from agentops.text import clean_requester

from .decision import BreakerAction, breaker_decide
from .models import BreakerState
from .shedding import shed_cap, sheddable_rows, state_locked

logger = logging.getLogger(__name__)

REQUESTER_LIMIT = 200


@dataclass(frozen=True)
class BreakerStep:
    """What one failure did to the breaker and what the caller should do next."""

    streak: int
    action: BreakerAction
    hard_down: bool


def _threshold() -> int:
    return int(settings.AGENTOPS_BREAKER_THRESHOLD)


def _failure_text(failure_type: str, http_status: int | None) -> str:
    return (
        f"{failure_type} at HTTP {http_status}"
        if http_status is not None
        else f"{failure_type} (no HTTP status)"
    )


def _hard_down_message(*, agent: Agent, streak: int, failure: str, action: BreakerAction) -> str:
    what = {
        BreakerAction.NOTHING: (
            "This failure is not one that shedding history can help, so nothing was set aside."
        ),
        BreakerAction.PROBE: (
            "The breaker is sending the failed request without its history "
            "to see whether the history is the cause."
        ),
        BreakerAction.SHED: (
            "Its history is implicated (a probe without it was answered in this run), "
            "so the newest turn is being set aside."
        ),
        BreakerAction.STOP_CAP: (
            f"The breaker already set aside {shed_cap()} turn(s) in this run, its cap, "
            "and stops shedding."
        ),
        BreakerAction.STOP_EMPTY: (
            "Nothing presented is left to set aside, so the breaker stops shedding."
        ),
    }[action]
    return (
        f"Agent {agent.name} (model {agent.model}) failed {streak} turns in a row; "
        f"the last failed with {failure}. "
        f"{what} Check the provider and the agent's configuration and the failures log; "
        f"GET /agents/{agent.name}/breaker shows the breaker and any rows it set aside."
    )


def breaker_note_failure(
    *, agent: Agent, failure_type: str, http_status: int | None
) -> BreakerStep:
    """Count one terminal failed turn (architecture.md §7.1): the streak grows, a probe still out is
    withdrawn, and from the threshold on every failure raises a ``hard-down`` alert. The
    returned action is NOTHING below the threshold and for a disposed agent."""
    with transaction.atomic():
        state = state_locked(agent.pk)
        state.streak += 1
        state.streak_version += 1
        _withdraw_locked(state, "a later failure was counted while it was out")
        hard_down = state.streak >= _threshold()
        action = BreakerAction.NOTHING
        # Re-read: the agent may have been removed since the caller loaded it.
        if hard_down and Agent.objects.filter(pk=agent.pk, disposed_at__isnull=True).exists():
            action = breaker_decide(
                failure_type=failure_type,
                http_status=http_status,
                sheds_this_run=state.sheds_this_run,
                shed_cap=shed_cap(),
                probe_answered_this_run=state.sheds_this_run > 0
                or state.probe_status == BreakerState.ProbeStatus.ANSWERED,
                rows_left=sheddable_rows(agent).exists(),
            )
        state.save()
        failure = _failure_text(failure_type, http_status)
        if hard_down:
            alert_raise(
                kind="hard-down",
                agent=agent.name,
                model=agent.model,
                message=_hard_down_message(
                    agent=agent, streak=state.streak, failure=failure, action=action
                ),
                data={
                    "streak": state.streak,
                    "failure_type": failure_type,
                    "http_status": http_status,
                    "action": action.value,
                },
            )
    if action in (BreakerAction.STOP_CAP, BreakerAction.STOP_EMPTY):
        logger.warning(
            "breaker: agent %s model %s: %d failures in a row (%s); stopped shedding: %s",
            agent.name,
            agent.model,
            state.streak,
            failure,
            "at the shed cap" if action == BreakerAction.STOP_CAP else "nothing left to set aside",
        )
    return BreakerStep(streak=state.streak, action=action, hard_down=hard_down)


def breaker_note_success(*, agent: Agent) -> None:
    """A completed call ends the run of failures: the streak resets, the next run sheds afresh
    under a new marker note and probes again, and a probe still out no longer counts.
    (Called inside the completed turn's transaction: it needs no savepoint of its own.)"""
    with transaction.atomic(savepoint=False):
        # Hand-written (``agentops.rows``): every completed turn reads it, most find no row.
        found = rows.instances(
            f"SELECT {rows.columns(BreakerState, 'b')} FROM {BreakerState._meta.db_table} b "
            "WHERE b.agent_id = %s FOR UPDATE",
            [agent.pk],
            BreakerState,
        )
        if not found:
            return
        state = found[0]
        if state.streak != 0:
            state.streak = 0
            state.streak_version += 1
        state.sheds_this_run = 0
        state.marker_row = None
        if not _withdraw_locked(
            state, "a completed call ended the run of failures while it was out"
        ):
            state.probe_status = BreakerState.ProbeStatus.NONE
        state.save()


def probe_abort_key(probe_id: uuid.UUID) -> str:
    """The Redis key a probe's call watches: set when the probe is withdrawn."""
    return f"agentops:probe-abort:{probe_id}"


def _signal_abort(probe_id: uuid.UUID) -> None:
    try:
        abort_signal(settings.REDIS_URL, probe_abort_key(probe_id))
    except redis.RedisError:
        # The probe's end still finds it withdrawn and ignores its answer; this only ends the call
        # sooner.
        logger.warning(
            "breaker: could not signal the withdrawal of probe %s to its call",
            probe_id,
            exc_info=True,
        )


def _withdraw_locked(state: BreakerState, reason: str) -> bool:
    """Withdraw the probe out, if any: its answer will be ignored, and its call is aborted once
    this transaction commits. Precondition: ``state`` is locked; the caller saves it."""
    if state.probe_status != BreakerState.ProbeStatus.OUT or state.probe_id is None:
        return False
    state.probe_status = BreakerState.ProbeStatus.WITHDRAWN
    state.probe_verdict = f"withdrawn: {reason}"
    probe_id = state.probe_id
    transaction.on_commit(lambda: _signal_abort(probe_id))
    return True


def breaker_probe_withdraw(*, agent: Agent, reason: str) -> bool:
    """Withdraw the agent's probe still out (architecture.md §7.3), e.g. when the agent is removed;
    True if there was one. Its answer is then set aside whatever it is, and its call is aborted."""
    with transaction.atomic():
        state = BreakerState.objects.select_for_update().filter(agent_id=agent.pk).first()
        if state is None or not _withdraw_locked(state, reason):
            return False
        state.save(update_fields=["probe_status", "probe_verdict"])
    logger.warning(
        "breaker: agent %s model %s: the probe still out was withdrawn (%s)",
        agent.name,
        agent.model,
        reason,
    )
    return True


RESTORE_REASON_LIMIT = 1000  # agentops.models.AuditEntry.reason


def history_row_restore(
    *, agent_name: str, row_id: int, actor: str, requester: Any, reason: Any = None
) -> HistoryRow:
    """Put a set-aside row back into the presented history, with an audit entry whose
    ``reason`` is the one given (else the requester, as before reasons were asked for).

    Raises BadRequest naming ``requester`` or ``reason`` when given and not a string, NotFound
    for an unknown agent or a row not in its history, Conflict when the row is not set aside."""
    for field, value in (("requester", requester), ("reason", reason)):
        if value is not None and not isinstance(value, str):
            raise bad_field(field, "must be a string")
    who = clean_requester(requester, limit=REQUESTER_LIMIT) if requester else ""
    why = clean_requester(reason, limit=RESTORE_REASON_LIMIT) if reason else ""
    with transaction.atomic():
        agent = (
            Agent.objects.select_for_update()
            .filter(name=agent_name, disposed_at__isnull=True)
            .first()
        )
        if agent is None:
            raise NotFound(f"no agent named {agent_name!r}", data={"field": "name"})
        row = HistoryRow.objects.select_for_update().filter(agent=agent, pk=row_id).first()
        if row is None:
            raise NotFound(
                f"row_id: agent {agent_name!r} has no history row {row_id}",
                data={"field": "row_id"},
            )
        if row.state != HistoryRow.State.SET_ASIDE:
            raise Conflict(
                f"history row {row_id} of agent {agent_name!r} is not set aside",
                data={"state": row.state},
            )
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
            actor=actor[:220],
            action="history.restore",
            target=f"agent:{agent.name}/history:{row.pk}",
            reason=why or who,
            data={
                "agent": agent.name,
                "row_id": row.pk,
                "seq": row.seq,
                "requester": who or None,
                "reason": why or None,
                **previous,
            },
        )
    logger.warning(
        "history row #%s of agent %s restored by %s%s",
        row.seq,
        agent.name,
        actor,
        (f" for {who}" if who else "") + (f": {why}" if why else ""),
    )
    if telemetry.enabled:  # a span an operator finds by agent, under the request that restored
        telemetry.tracer().start_span(
            "agentops.breaker.restore",
            attributes={
                "agentops.agent": agent.name,
                "agentops.history.row_id": row.pk,
                "agentops.history.seq": row.seq,
                "agentops.restore.by": telemetry.bounded(actor),
            },
        ).end()
    return row
