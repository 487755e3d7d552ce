"""What a turn's steps read and write (``turns.turn_run``): blocking ORM work, each function
one hop through the runtime's database threads."""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace
from typing import Final

from django.db import connection
from django.utils import timezone

from agentops import rows, telemetry
from agentops.models import Agent, HistoryRow, Provider
from agentops.prices import Basis
from calls.client import CallResult, Timeline
from calls.compile import compile_request, nothing_to_answer
from calls.records import UNSTORABLE
from calls.run import ProviderCall
from calls.tracing import attempt_traced
from calls.types import CallOutput, CompiledRequest, ProviderError
from inference.models import InferenceCall, Turn
from turns.durable import pace, paced_left_ms
from turns.episodes import serving_noted, serving_settled
from turns.holds import hold_if_waiting, pacing_left_ms
from turns.lease import TurnLease
from turns.moves import turn_claim, turn_complete, turn_end_unanswered
from turns.runtime import TurnRuntime
from turns.serving import serving_choose
from turns.targets import Serving, primary_serving, request_for, routed
from turns.tracing import held_since_ns, turn_held_recorded, turn_noted, turn_traced

logger = logging.getLogger(__name__)

STOPPED_MID_CALL: Final = ProviderError(
    type="aborted", message="the worker making this call stopped before it ended"
)


class Outcome(enum.Enum):
    """How a run left its turn: ended (or re-armed) by it, held by a provider wait (the turns
    behind it wait with it), or stopped for another reason its status tells (cancelled,
    handed back, not this run's, the lease lost)."""

    ENDED = "ended"
    HELD = "held"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Ready:
    """A turn ready for its call: the turn as loaded, its request and its call (not begun)."""

    turn: Turn
    request: CompiledRequest
    call: ProviderCall
    serving: Serving


@dataclass(frozen=True)
class Claimed:
    """A turn claimed for this run; ``held``: as it was while held, when the run resumes it."""

    turn: Turn
    held: Turn | None


def turn_start(rt: TurnRuntime, turn_id: int, status: str, lease: TurnLease) -> Claimed | Outcome:
    """Claim the turn for this run (a held one only once its wait is over), and close what a
    stopped worker left open: the claimed turn, or why it is not this run's to go on with."""
    now = timezone.now()
    held = (
        Turn.objects.select_related("agent").filter(pk=turn_id, status=Turn.Status.HELD).first()
        if status == Turn.Status.HELD
        else None
    )
    if held is not None and hold_if_waiting(rt.rechecks, held):
        return Outcome.HELD
    # A turn left running was another run's: the worker that ran it died, or lost its lease.
    lost_by = (
        Turn.objects.filter(pk=turn_id).values_list("claimed_by", flat=True).first()
        if status == Turn.Status.RUNNING
        else None
    )
    if not turn_claim(turn_id=turn_id, owner=lease.owner, now=now):
        return Outcome.STOPPED
    # A call still "in flight" now belonged to a worker that stopped mid-call (this run holds
    # the lease, so no one else is calling): record it as aborted, not leave it open forever.
    # Only a turn left running has one (a queued or held turn's calls all ended).
    stopped: list[InferenceCall] = []
    aborted = 0
    taken_over = bool(lost_by) and lost_by != lease.owner
    if status == Turn.Status.RUNNING:
        open_calls = InferenceCall.objects.filter(turn_id=turn_id, outcome__isnull=True)
        if telemetry.enabled:
            stopped = list(open_calls)
        # What such a call used is unknown (the worker that read it is gone): no cost, never 0.
        aborted = open_calls.update(
            outcome=InferenceCall.Outcome.ABORTED,
            ended_at=now,
            error=STOPPED_MID_CALL.as_dict(),
            cost_basis=Basis.UNREPORTED.value,
        )
        if taken_over:
            turn_noted(
                turn_id,
                "agentops.turn.taken_over",
                {"agentops.lease.lost_by": lost_by, "agentops.lease.taken_by": lease.owner},
            )
    turn = _turn_loaded(turn_id)
    if taken_over:
        _taken_over(turn, str(lost_by), lease.owner, aborted, stopped)
    return Claimed(turn, held)


def turn_resumed(turn: Turn, held: Turn) -> None:
    """A held turn claimed to run: how long it was held (its span, the held-time metric), and
    after a release that lifted a 429's wait, the 429's own pacing kept for the next call.
    Apart from the claim, so a retry after the database dropped still keeps the pacing."""
    _resumed(turn, held)
    if (release_pacing_ms := pacing_left_ms(turn)) > paced_left_ms(turn):
        pace(turn, delay_ms=release_pacing_ms, reason="pacing after a 429")


class AnswerUnstorable(Exception):
    """The answer that arrived cannot be stored (``calls.records.UNSTORABLE``): the turn ends
    with a note, never a second call for it."""


def call_settled(call: ProviderCall, turn: Turn, *, answer: CallOutput | None) -> str | None:
    """The call's row written and its end announced (once), then its answer stored (the turn
    ends if it may still move: ``turn_complete`` checks under the row's lock), or with no
    answer the turn's status read. Safe to run again. Raises ``AnswerUnstorable``."""
    call.end()
    serving_settled(call.agent, call.row)
    if answer is None:
        return turn_status(turn.pk)
    try:
        turn_complete(turn=turn, output=answer)
    except UNSTORABLE as exc:
        raise AnswerUnstorable(str(exc)) from exc
    return None


def turn_ready(rt: TurnRuntime, turn_id: int, *, need_tokens: int = 0) -> Ready | Outcome:
    """The running turn, its request compiled from its presented rows and its call made ready,
    at the last moment before the call; or why not: it is no longer running (``STOPPED``),
    nothing is left to answer and it ended without a call (``ENDED``), or the admission check
    holds it (``HELD``)."""
    turn = _turn_loaded(turn_id)
    if turn.status != Turn.Status.RUNNING:
        return Outcome.STOPPED
    agent = turn.agent
    presented = rows.instances(
        _sql().presented, [turn.agent_id, HistoryRow.State.PRESENTED.value], HistoryRow
    )
    if nothing_to_answer(presented, lambda: set(turn.trigger_rows.values_list("id", flat=True))):
        # No request is sent whose only question is a note.
        turn_end_unanswered(turn=turn)
        return Outcome.ENDED
    # With alternates, a held or down primary may be served from one (§6.11); without, or
    # when the primary's wait is to be waited out, the admission check holds the turn.
    serving = (
        serving_choose(rt.pacer, agent, time.time() * 1000, need_tokens=need_tokens)
        if routed(agent)
        else None
    )
    if serving is None:
        if hold_if_waiting(rt.rechecks, turn):
            return Outcome.HELD
        serving = primary_serving(agent)
    serving_noted(agent, serving)
    request, left_out = request_for(compile_request(agent, presented), agent, serving.target)
    call = ProviderCall(
        rt,
        agent,
        request,
        InferenceCall.Kind.PRIMARY,
        turn=turn,
        provider=serving.target.provider,
        route=serving.choice.reason + left_out,
        route_kind=serving.choice.kind,
        spares=[(t.provider, t.model) for t in serving.spares],
        first_content_bound=serving.first_content_bound,
    )
    return Ready(turn, request, call, serving)


def _taken_over(
    turn: Turn, lost_by: str, taken_by: str, aborted: int, stopped: list[InferenceCall]
) -> None:
    """Say that this run took the turn over from the run ``lost_by``, whose lease lapsed and
    which left ``aborted`` calls in flight, and trace those (``stopped``: their rows, when
    telemetry is exported) as aborted: their ends were never recorded."""
    with turn_traced(turn):
        logger.warning(
            "agent %s turn %s taken over: %s runs it now; %s left it running and its lease lapsed "
            "(that worker died, lost the database, or its run stopped on an error); %d call(s) it "
            "left in flight recorded as aborted",
            turn.agent.name,
            turn.pk,
            taken_by,
            lost_by,
            aborted,
        )
        now_ms = time.time() * 1000
        for call in stopped:
            sent_ms = call.sent_at.timestamp() * 1000 if call.sent_at is not None else now_ms
            result = CallResult(
                outcome="aborted",
                timeline=Timeline(sent=sent_ms, ended=now_ms),
                error=STOPPED_MID_CALL,
            )
            attempt_traced(agent=turn.agent, call=call, result=result)


def _resumed(turn: Turn, held: Turn) -> None:
    """A held turn claimed to run: how long it was held, on its span and in the held-time metric."""
    since = held_since_ns(held) if telemetry.enabled else None
    if since is None:
        return
    held_s = max(time.time_ns() - since, 0) / 1e9
    turn_noted(turn.pk, "agentops.turn.resumed", {"agentops.held_ms": round(held_s * 1000)})
    turn_held_recorded(turn.agent, held_s)


@cache
def _sql() -> SimpleNamespace:
    """The statements of a turn's start, hand-written (``agentops.rows``)."""
    return SimpleNamespace(
        turn=f"""
            SELECT {rows.columns(Turn, "t")}, {rows.columns(Agent, "a")}, {rows.columns(Provider, "p")}
            FROM {Turn._meta.db_table} t
            JOIN {Agent._meta.db_table} a ON a.id = t.agent_id
            JOIN {Provider._meta.db_table} p ON p.id = a.provider_id
            WHERE t.id = %s""",
        presented=f"""
            SELECT {rows.columns(HistoryRow, "h")} FROM {HistoryRow._meta.db_table} h
            WHERE h.agent_id = %s AND h.state = %s ORDER BY h.seq""",
        status=f"SELECT status FROM {Turn._meta.db_table} WHERE id = %s",
    )


def _turn_loaded(turn_id: int) -> Turn:
    """The turn with its agent and the agent's provider, in one statement."""
    found = rows.fetch(_sql().turn, [turn_id], Turn, Agent, Provider)
    if not found:
        raise Turn.DoesNotExist(f"turn {turn_id}")
    turn, agent, provider = found[0]
    assert isinstance(turn, Turn) and isinstance(agent, Agent) and isinstance(provider, Provider)
    agent.provider = provider
    turn.agent = agent
    return turn


def turn_status(turn_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(_sql().status, [turn_id])
        found = cursor.fetchone()
    if found is None:
        raise Turn.DoesNotExist(f"turn {turn_id}")
    return str(found[0])
