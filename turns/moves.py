"""The drain's turn moves (architecture.md §5.1): claim, hold, hand back, complete, re-arm and
fail, each one of ``turns.services.TRANSITIONS``'s moves, made with ``turn_move`` or under the
row's lock."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from agentops import rows, telemetry
from agentops.alerts import alert_raise
from agentops.failures import failures_log_write
from agentops.memory import Recent
from agentops.models import Agent, HistoryRow
from agentops.services import history_append
from agentops.text import bound_text
from breaker.services import breaker_note_success
from calls.records import UNSTORABLE
from calls.types import CallOutput, ProviderError
from inference.models import InferenceCall, Turn
from turns.notes import failure_note_text
from turns.queue import enqueue_drain, schedule_drain
from turns.services import Status, sources, turn_announce, turn_may_move, turn_move
from turns.tracing import turn_event, turn_trace_end

logger = logging.getLogger(__name__)


# ``_move`` to running for ``turn_claim``, hand-written: it runs once per turn on the worker's
# hot path, where the ORM's query building costs more CPU than the statement.
_CLAIM_SQL = f"""
UPDATE {Turn._meta.db_table}
SET status = %s, claimed_by = %s, started_at = COALESCE(started_at, %s), attempts = attempts + 1,
    hold_until = NULL, hold_reason = ''
WHERE id = %s AND status = ANY(%s)
"""


def turn_claim(*, turn_id: int, owner: str, now: datetime) -> bool:
    """Claim a queued, held or running (left by a dead worker) turn for the drain holding the
    agent's lease: it runs now. False if it is no longer open."""
    with connection.cursor() as cursor:
        cursor.execute(
            _CLAIM_SQL,
            [Status.RUNNING.value, owner, now, turn_id, [str(s) for s in sources(Status.RUNNING)]],
        )
        claimed = cursor.rowcount == 1
    if claimed:
        turn_announce(turn_id, Status.RUNNING)
    return claimed


# The last hold logged per turn, so a re-check that holds it again logs nothing (a bound, not a
# policy: a turn held past a day, or among more than this many, logs its hold once more).
HOLDS_LOGGED_KEPT = 10_000
HoldsLogged = Recent[int, tuple[datetime | None, str]]


def holds_logged() -> HoldsLogged:
    """A process's memory of the last hold it logged per turn (kept by its re-checks,
    ``turns.holds.Rechecks``)."""
    return Recent(size=HOLDS_LOGGED_KEPT, ttl_s=86_400)


def turn_hold(*, turn: Turn, until: datetime | None, reason: str, logged: HoldsLogged) -> bool:
    """Hold a running or held turn by a provider wait until ``until`` (None: until released);
    no failure is counted and no note written (architecture.md §6.6). False if it moved
    meanwhile. ``logged``: the holds this process logged, so the same hold is logged once."""
    # A held turn held again at its re-check is the same hold: its span has the event already.
    event = (
        {}
        if turn.status == Status.HELD
        else turn_event(
            "agentops.turn.held",
            {
                "agentops.hold.until": until.isoformat() if until else "released",
                "agentops.hold.reason": telemetry.bounded(reason),
            },
        )
    )
    held = turn_move(turn.pk, Status.HELD, hold_until=until, hold_reason=reason, **event)
    if held and turn.status != Status.HELD:
        # The drain claims a held turn at each re-check and holds it again: one line per hold,
        # not one per re-check (the same end and reason is the same hold).
        if logged.get(turn.pk) != (until, reason):
            logged.put(turn.pk, (until, reason))
            logger.info(
                "agent %s turn %s held until %s: %s",
                turn.agent.name,
                turn.pk,
                until or "released",
                reason,
            )
        turn_announce(turn.pk, Status.HELD, held_until=until.isoformat() if until else None)
    return held


def turn_hand_back(*, turn: Turn) -> bool:
    """A worker's warm shutdown hands a running turn back without a call (architecture.md §6.11):
    queued again for the next worker."""
    handed = turn_move(
        turn.pk,
        Status.QUEUED,
        among=[Status.RUNNING],
        **turn_event("agentops.turn.handed_back", {"agentops.worker": telemetry.process_label()}),
    )
    if handed:
        logger.warning(
            "agent %s turn %s handed back: the worker is shutting down", turn.agent.name, turn.pk
        )
        turn_announce(turn.pk, Status.QUEUED)
        # Its pacing (``not_before``) stays on the turn: the next worker runs it no earlier.
        not_before = Turn.objects.filter(pk=turn.pk).values_list("not_before", flat=True).first()
        left_s = (not_before - timezone.now()).total_seconds() if not_before is not None else 0.0
        if left_s > 0:
            schedule_drain(turn.agent_id, left_s)
        else:
            enqueue_drain(turn.agent_id)
    return handed


def _locked_with_agent(turn_id: int) -> Turn:
    """The turn's row and its agent's (for the history's next sequence number), locked until
    the transaction ends, in one hand-written statement (``agentops.rows``)."""
    found = rows.fetch(
        f"""SELECT {rows.columns(Turn, "t")}, {rows.columns(Agent, "a")}
        FROM {Turn._meta.db_table} t JOIN {Agent._meta.db_table} a ON a.id = t.agent_id
        WHERE t.id = %s FOR UPDATE""",
        [turn_id],
        Turn,
        Agent,
    )
    if not found:
        raise Turn.DoesNotExist(f"turn {turn_id}")
    locked, agent = found[0]
    assert isinstance(locked, Turn) and isinstance(agent, Agent)
    locked.agent = agent
    return locked


def turn_complete(*, turn: Turn, output: CallOutput) -> None:
    """A completed call: store the assistant row, end the breaker's run of failures, and move
    the turn to ``requires_action`` (tool calls handed out) or ``succeeded``."""
    now = timezone.now()
    with transaction.atomic():
        locked = _locked_with_agent(turn.pk)
        if not turn_may_move(locked, Status.SUCCEEDED):  # cancelled while the call was out
            return
        agent = locked.agent
        history_append(
            agent=agent,
            participant=agent.participant,
            role=HistoryRow.Role.ASSISTANT,
            content=output.blocks,
        )
        breaker_note_success(agent=agent)
        calls = output.tool_calls
        locked.output = {
            "content": output.text,
            "stop_reason": output.stop_reason,
            "tool_calls": calls,
        }
        locked.rounds += 1
        locked.error = None
        if calls:
            locked.status = Status.REQUIRES_ACTION
            locked.pending_tool_calls = calls
        else:
            locked.status = Status.SUCCEEDED
            locked.ended_at = now
        rows.update(
            Turn,
            turn.pk,
            output=locked.output,
            rounds=locked.rounds,
            error=None,
            status=locked.status,
            pending_tool_calls=locked.pending_tool_calls,
            ended_at=locked.ended_at,
        )
        turn_announce(turn.pk, locked.status)
        if locked.status in Turn.ENDED:
            turn_trace_end(locked, agent=agent, status=locked.status)


# A turn's ``output.stop_reason`` when it ended without a call: what followed the agent's newest
# answer was only the service's own notes (architecture.md §5.8).
NOTHING_TO_ANSWER = "nothing_to_answer"


def turn_end_unanswered(*, turn: Turn) -> bool:
    """End a running turn that has nothing to answer, without a call: it succeeds, its output
    empty with the stop reason ``nothing_to_answer``, and the breaker's run of failures ends as
    after a completed call (what is left presented fails no more: nothing of it is sent).
    False when it no longer may end (cancelled meanwhile)."""
    with transaction.atomic():
        locked = _locked_with_agent(turn.pk)
        if not turn_may_move(locked, Status.SUCCEEDED):
            return False
        locked.output = {"content": "", "stop_reason": NOTHING_TO_ANSWER, "tool_calls": []}
        locked.status, locked.ended_at = Status.SUCCEEDED, timezone.now()
        rows.update(
            Turn,
            turn.pk,
            output=locked.output,
            status=locked.status,
            ended_at=locked.ended_at,
            pending_tool_calls=[],
        )
        breaker_note_success(agent=locked.agent)
        logger.info(
            "agent %s turn %s ended without a call: nothing is left to answer (after the "
            "agent's newest answer come only agentops' own notes)",
            locked.agent.name,
            turn.pk,
        )
        turn_announce(turn.pk, Status.SUCCEEDED)
        turn_trace_end(locked, agent=locked.agent, status=Status.SUCCEEDED)
    return True


def turn_rearm(*, turn: Turn, error: ProviderError) -> bool:
    """Queue an exhausted turn to be sent again after the next delay of the ladder (architecture.md
    §5.7). Returns False when the ladder is spent (or the turn moved meanwhile)."""
    ladder = settings.AGENTOPS_REARM_DELAYS_MS
    if turn.rearms >= len(ladder):
        return False
    delay_ms = ladder[turn.rearms]
    not_before = timezone.now() + timedelta(milliseconds=delay_ms)
    rearmed = turn_move(
        turn.pk,
        Status.QUEUED,
        among=[Status.RUNNING],
        rearms=F("rearms") + 1,
        not_before=not_before,
        # Queued, not held: why it waits is its waiting reason (with ``not_before``).
        waiting_reason=f"re-armed after {error.type} ({turn.rearms + 1} of {len(ladder)})",
        error=error.as_dict(),
        **turn_event(
            "agentops.turn.rearmed",
            {
                "error.type": error.type,
                "agentops.rearm.delay_ms": delay_ms,
                "agentops.rearm.count": turn.rearms + 1,
            },
        ),
    )
    if rearmed:
        logger.warning(
            "agent %s turn %s exhausted by %s; sending it again in %.0f s (%s of %s)",
            turn.agent.name,
            turn.pk,
            error.type,
            delay_ms / 1000,
            turn.rearms + 1,
            len(ladder),
        )
        turn_announce(turn.pk, Status.QUEUED)
        schedule_drain(turn.agent_id, delay_ms / 1000)
    return rearmed


def turn_fail(*, turn: Turn, error: ProviderError, status: str, timed_out_again: bool) -> bool:
    """End a running turn in failure (``failed`` or ``exhausted``) with its note and incident.
    False if it was no longer running (cancelled meanwhile)."""
    now = timezone.now()
    with transaction.atomic():
        locked = _locked_with_agent(turn.pk)
        if not turn_may_move(locked, status):  # cancelled while the call was out
            return False
        agent = locked.agent
        note = history_append(
            agent=agent,
            participant="agentops",
            role=HistoryRow.Role.SYSTEM_NOTE,
            content=failure_note_text(error, timed_out_again=timed_out_again),
            note_kind=HistoryRow.NoteKind.FAILED,
        )
        locked.status = status
        locked.error = error.as_dict()
        locked.note = note
        locked.ended_at = now
        locked.save(update_fields=["status", "error", "note", "ended_at"])
        turn_trace_end(
            locked,
            agent=agent,
            status=status,
            error_type=error.bound or error.type,
            message=error.message,
        )
        logger.warning(
            "agent %s turn %s %s: %s (%s, HTTP %s)",
            agent.name,
            turn.pk,
            status,
            error.message[:300],
            error.type,
            error.http_status,
        )
        # The incident record, in this transaction: a rolled-back ending leaves none. An exhausted
        # turn is an alert (architecture.md §8: row, failures.log line, dashboard, webhooks); a
        # failed one is only logged (its note and the breaker's streak tell the rest).
        message = f"turn {turn.pk} {status}: {error.message}"
        incident = {"turn": turn.pk, "rearms": locked.rearms, "error": error.as_dict()}
        if status == Status.EXHAUSTED:
            alert_raise(
                kind="turn-exhausted",
                agent=agent.name,
                model=agent.model,
                message=message,
                data=incident,
            )
        else:
            agent_name, model = agent.name, agent.model
            transaction.on_commit(
                lambda: failures_log_write(
                    kind="turn-failed", agent=agent_name, model=model, message=message, **incident
                )
            )
        turn_announce(turn.pk, status)
    return True


def turn_fail_unstorable(*, turn: Turn, call_id: int, exc: BaseException) -> None:
    """End a turn whose answer arrived but could not be stored (architecture.md §15): the database
    refused it for what it holds, so storing it again would fail again, and calling again would
    pay for the answer twice. The call's row says so; the turn fails with its note, or without
    one when the note cannot be stored either."""
    error = ProviderError(
        type="unknown",
        provider_code="answer_unstorable",
        message=bound_text(
            f"the model's answer arrived but could not be stored ({type(exc).__name__}: {exc}); "
            "it was not requested again"
        ),
    )
    InferenceCall.objects.filter(pk=call_id).update(error=error.as_dict())
    try:
        with transaction.atomic():
            turn_fail(turn=turn, error=error, status=Status.FAILED, timed_out_again=False)
    except UNSTORABLE as note_exc:
        logger.error(
            "agent %s turn %s: its failure note could not be stored either (%s)",
            turn.agent.name,
            turn.pk,
            note_exc,
        )
        if turn_move(
            turn.pk,
            Status.FAILED,
            among=[Status.RUNNING],
            error=error.as_dict(),
            ended_at=timezone.now(),
        ):
            turn_announce(turn.pk, Status.FAILED)
            if telemetry.enabled:
                turn_trace_end(
                    Turn.objects.get(pk=turn.pk),
                    status=Status.FAILED,
                    error_type=error.type,
                    message=error.message,
                )
