"""Running an agent's turns: one at a time per agent, across any number of workers (architecture.md §5.1).

Exclusivity is the agent's turn lease (``turns.lease``): a run takes the agent's turns
only while it holds the lease, which the process's one renewer keeps alive. A worker that dies
stops renewing; the lease lapses and the next delivery (the beat sweep) resumes the turn it
left ``running``. A duplicate delivery to another worker finds the lease held, or the turn
ended, and does nothing.

A worker runs each agent's turns as one coroutine on the process's background loop: the Celery
task hands the agent over (``agent_drain``) and returns, so what a worker holds is bounded by
``AGENTOPS_WORKER_TURNS``, not by its threads. The coroutine's call and its waits between calls
cost a coroutine each; its ORM bookkeeping runs in the process's bookkeeping pool
(``agentops.background.bookkeeping``), and the breaker's probe, which blocks, on a thread of
the loop's own. A warm shutdown waits for every run to end (``agentops.lifecycle``).
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Callable
from datetime import datetime
from functools import cache, partial
from types import SimpleNamespace
from typing import Final, NamedTuple, TypeVar

from django.conf import settings
from django.db import connection
from django.utils import timezone

from agentops import lifecycle, rows, telemetry
from agentops.background import LoopWake, PerProcess, background_loop, blocking, bookkeeping
from agentops.models import Agent, HistoryRow, Provider
from calls.client import CallResult, Timeline
from calls.compile import compile_request
from calls.records import UNSTORABLE
from calls.run import ProviderCall, Watch
from calls.tracing import attempt_traced
from calls.types import CompiledRequest, ProviderError
from inference.models import InferenceCall, Turn
from turns.after_failure import breaker_after_failure
from turns.durable import (
    UNREACHABLE,
    LeaseLost,
    durably,
    durably_on_loop,
    offer_pending_waits_until,
    pace,
    paced_left_ms,
    retry_reason,
)
from turns.holds import (
    ephemeral_wait_error,
    hold_if_waiting,
    pacing_left_ms,
    record_wait,
    stated_wait,
)
from turns.lease import TurnLease, lease_claim
from turns.policy import Action, Decision, PolicySettings, RetryState, decide
from turns.queue import enqueue_drain
from turns.services import (
    cancel_key,
    turn_claim,
    turn_complete,
    turn_fail,
    turn_fail_unstorable,
    turn_hand_back,
    turn_rearm,
)
from turns.tracing import held_since_ns, turn_held_recorded, turn_noted, turn_traced

logger = logging.getLogger(__name__)

T = TypeVar("T")


# The agent's first turn that is not ended, with its status and earliest instant: one
# statement on the hot path of every run (hand-written: the ORM's query building costs more CPU
# than the statement itself).
_NEXT_TURN_SQL = f"""
SELECT id, status, not_before FROM {Turn._meta.db_table}
WHERE agent_id = %s AND status = ANY(%s) ORDER BY id LIMIT 1
"""
_OPEN = [str(s) for s in Turn.OPEN]
# Hand-written: read after every call that did not complete, and after a run leaves a turn open.
_STATUS_SQL = f"SELECT status FROM {Turn._meta.db_table} WHERE id = %s"


def next_turn(agent_id: int, *, now: datetime) -> tuple[int, str] | None:
    """The agent's next turn to run and its status, or None. Turns run in order: a turn waiting for tool
    results blocks the turns behind it (their request would carry a tool call without its
    result), and so does a queued turn that may not run before a later instant (a re-arm).
    A held turn is returned: running it starts with the admission check."""
    with connection.cursor() as cursor:
        cursor.execute(_NEXT_TURN_SQL, [agent_id, _OPEN])
        first = cursor.fetchone()
    if first is None:
        return None
    turn_id, status, not_before = first
    if status == Turn.Status.REQUIRES_ACTION:
        return None
    if status == Turn.Status.QUEUED and not_before is not None and not_before > now:
        return None
    return int(turn_id), str(status)


class _Runs:
    """The agents whose turns run in this process (each with whether a delivery came while it
    ran: it looks again before it ends), and the slots left of the process's capacity."""

    def __init__(self, capacity: int) -> None:
        self.slots = threading.BoundedSemaphore(capacity)
        self.lock = threading.Lock()
        self.again: dict[int, bool] = {}


# The runs of this process, with its capacity's slots.
_runs_here = PerProcess(lambda: _Runs(settings.AGENTOPS_WORKER_TURNS))


def agent_drain(agent_id: int) -> None:
    """Hand the agent's queued turns to the background loop to run in order, and return (the
    Celery task's body). A run of the agent already going in this process is told to look
    again before it ends instead. While the process runs ``AGENTOPS_WORKER_TURNS`` agents this
    waits for one to end, so a full worker takes no more work from the broker."""
    if lifecycle.stopping.is_set():
        return  # a worker shutting down takes no new turns; the sweep re-enqueues them
    runs = _runs_here()
    with runs.lock:
        if agent_id in runs.again:
            runs.again[agent_id] = True
            return
    while not runs.slots.acquire(timeout=0.5):
        if lifecycle.stopping.is_set():
            return
    with runs.lock:
        if agent_id in runs.again:  # handed over by another delivery meanwhile
            runs.again[agent_id] = True
            runs.slots.release()
            return
        runs.again[agent_id] = False
    lifecycle.work_started()
    background_loop().start(_agent_runs(agent_id, runs), partial(_run_ended, agent_id, runs))


def _run_ended(agent_id: int, runs: _Runs, future: asyncio.Future[None]) -> None:
    runs.slots.release()
    lifecycle.work_ended()
    if not future.cancelled() and (exc := future.exception()) is not None:
        logger.error(
            "agent %s: its run stopped on an error; the sweep hands it on", agent_id, exc_info=exc
        )


async def _agent_runs(agent_id: int, runs: _Runs) -> None:
    """Run the agent while it has turns; once more if a delivery came meanwhile, however the
    run ended (a release's wake-up for a turn the run had just held, a turn submitted after
    its claim found another worker's lease and before that worker looked once more)."""
    try:
        while True:
            await _agent_run(agent_id)
            with runs.lock:
                if not runs.again.get(agent_id) or lifecycle.stopping.is_set():
                    del runs.again[agent_id]
                    return
                runs.again[agent_id] = False
    except BaseException:
        with runs.lock:
            runs.again.pop(agent_id, None)
        raise


async def _agent_run(agent_id: int) -> None:
    """Run the agent's queued turns in order while this run holds its lease."""
    claimed = await bookkeeping(_run_start, agent_id)
    if claimed is None:
        logger.debug("agent %s: another worker holds its turn lease", agent_id)
        return
    lease, first = claimed
    idle = False
    try:
        while not lease.lost and not lifecycle.stopping.is_set():
            if first is not _NOT_LOOKED:
                found, first = first, _NOT_LOOKED
            else:
                found = await _durably(
                    f"agent {agent_id}: find its next turn",
                    lambda: next_turn(agent_id, now=timezone.now()),
                    lease,
                )
            if found is None:
                idle = True
                break
            turn_id, status = found
            # A database error before the call goes out runs the turn again from the top;
            # every write after a call is made is retried where it is (durably).
            ran = await durably_on_loop(
                f"agent {agent_id}: run turn {turn_id}",
                partial(turn_run, turn_id, status, lease),
                lease,
            )
            first = ran.next  # looked for in the hop that stored the answer, if it was
            if not ran.ended and await _turn_status(turn_id, lease) == Turn.Status.HELD:
                break  # its re-check is scheduled; the turns behind it wait with it
    except LeaseLost:
        logger.error(
            "agent %s: the turn lease was taken over while the database was down; this run stops",
            agent_id,
        )
    finally:
        await bookkeeping(run_end, lease, idle=idle)


# The next turn of a run, when the hop before could not look for it (or did not).
_NOT_LOOKED: Final = (-1, "")


class Ran(NamedTuple):
    """How ``turn_run`` left its turn: whether it ended it (or re-armed it), and the agent's
    next turn when the hop that stored the answer looked for it too (else ``_NOT_LOOKED``)."""

    ended: bool
    next: tuple[int, str] | None = _NOT_LOOKED


_ENDED: Final = Ran(True)
_STOPPED: Final = Ran(False)


def _run_start(agent_id: int) -> tuple[TurnLease, tuple[int, str] | None] | None:
    """Claim the agent's lease and, in the same hop, find its next turn: the lease and the turn
    (``_NOT_LOOKED`` when the database did not answer after the claim: the run looks again,
    durably), or None when another worker holds the lease. Any other error releases the lease
    (the run has not started: its ``finally`` would not)."""
    lease = lease_claim(agent_id)
    if lease is None:
        return None
    try:
        return lease, next_turn(agent_id, now=timezone.now())
    except UNREACHABLE:
        connection.close()  # as the bookkeeping pool drops a connection whose work failed on it
        return lease, _NOT_LOOKED
    except BaseException:
        lease.release()
        raise


def run_end(lease: TurnLease, *, idle: bool) -> None:
    """End a run: release the agent's lease and, when the run ran out of turns (``idle``),
    look once more. A turn submitted between the run's last look and the release was
    delivered to a worker that found the lease still held and did nothing: without this look
    it would wait for the sweep."""
    lease.release()
    # A run that ends, even one whose lease was taken, hands its stated waits to the journal:
    # the run that takes over must not call before their end.
    offer_pending_waits_until(time.monotonic() + settings.AGENTOPS_TURN_LEASE_MS / 1000)
    if not idle:
        return  # held, stopped or taken over: its own re-check, the sweep or the new owner goes on
    try:
        if next_turn(lease.agent_id, now=timezone.now()) is not None:
            enqueue_drain(lease.agent_id)
    except UNREACHABLE:
        connection.close()  # the sweep hands the agent on


def _policy_settings() -> PolicySettings:
    return PolicySettings(
        deadline_retry_delay_ms=settings.AGENTOPS_DEADLINE_RETRY_DELAY_MS,
        pacing_floor_ms=settings.AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS,
        retry_episode_ms=settings.AGENTOPS_RETRY_EPISODE_MS,
    )


async def turn_run(turn_id: int, status: str, lease: TurnLease) -> Ran:
    """Run one turn's rounds until it succeeds, fails, needs tool results, is held by a
    provider wait or is cancelled. Run only while holding the agent's turn lease; ``status``
    is the turn's as ``next_turn`` found it. Ended when this run ended the turn (or re-armed
    it); not when it stopped for another reason (held, cancelled, handed back, not its own),
    which its status tells."""
    started = await bookkeeping(_turn_start, turn_id, status, lease)
    if started is None:
        return _STOPPED
    turn, ready = started
    with turn_traced(turn):
        return await _turn_rounds(turn, ready, lease)


async def _turn_rounds(turn: Turn, ready: Ready | None, lease: TurnLease) -> Ran:
    """``turn_run`` once the turn is claimed: its rounds, under the turn's span."""
    turn_id = turn.pk
    # The pacing kept on the turn (a 429's, a retry delay, a re-arm) binds whichever worker
    # runs it, after a hand-back, a crash or a release.
    if ready is None and not await _sleep_unless_cancelled(turn, paced_left_ms(turn) / 1000, lease):
        return _STOPPED
    # The count of consecutive cuts starts at zero with each turn, except that a re-armed turn
    # gets no fresh call for a cut before one of its rounds has run (architecture.md §5.7).
    state = RetryState(consecutive_cuts=1 if turn.rearms else 0)
    while True:
        if ready is None:
            # (Also where a turn cancelled during a wait before a retry stops: it is not running.)
            ready = await bookkeeping(_turn_ready, turn_id)
            if ready is None:
                return _STOPPED
        (turn, request, provider_call), ready = ready, None
        ended = await _call_once(turn, provider_call, lease)
        if ended.answered:
            return Ran(True, ended.next)
        if ended.unstorable is not None:
            unstorable = ended.unstorable
            await _durably(
                f"turn {turn_id}: end, its answer unstorable",
                partial(turn_fail_unstorable, turn=turn, call_id=ended.call.pk, exc=unstorable),
                lease,
            )
            return _ENDED
        result, call = ended.result, ended.call
        if lease.lost:
            return _STOPPED
        # A turn cancelled while the call was out is never turned into a retry. (An answer is
        # stored only if the turn may still move: ``turn_complete`` and ``turn_fail`` check
        # that under the row's lock, so a completed call needs no read of its own.)
        if not ended.completed and ended.status != Turn.Status.RUNNING:
            return _STOPPED
        if ended.completed:  # completed, but no answer to store: the model ran out at its limit
            error = ProviderError(
                type="unknown",
                provider_code="empty_length_stop",
                message="the model stopped at its output limit with no text and no tool call; the same request would run away again",
            )
            await _durably(
                f"call {call.pk}: record the empty stop",
                partial(
                    InferenceCall.objects.filter(pk=call.pk).update,
                    outcome=InferenceCall.Outcome.ERROR,
                    error=error.as_dict(),
                ),
                lease,
            )
            if await _durably(
                f"turn {turn_id}: fail",
                partial(
                    turn_fail,
                    turn=turn,
                    error=error,
                    status=Turn.Status.FAILED,
                    timed_out_again=False,
                ),
                lease,
            ):
                await blocking(
                    breaker_after_failure, turn=turn, error=error, failed=request, holding=lease
                )
            return _ENDED
        error = result.error or ProviderError(
            type="unknown", message="the call failed without an error"
        )
        now_ms = time.time() * 1000
        decision, state = decide(
            error, state, now_ms=now_ms, settings=_policy_settings(), jitter=random.random()
        )
        if decision.action is Action.HOLD:
            delay_ms = await bookkeeping(stated_wait, turn, error, now_ms, recorded=ended.binding)
            if delay_ms is None:
                continue  # recorded: the admission check at the top of the loop holds the turn
            if delay_ms < 0:  # an ephemeral run's wait too long to sleep: it ends now
                await _durably(
                    f"turn {turn_id}: end",
                    partial(
                        turn_fail,
                        turn=turn,
                        error=ephemeral_wait_error(error),
                        status=Turn.Status.EXHAUSTED,
                        timed_out_again=False,
                    ),
                    lease,
                )
                return _ENDED
            decision = Decision(Action.RETRY, delay_ms=delay_ms)
            why = (
                "pacing after a 429" if error.type == "rate_limit" else "the provider's stated wait"
            )
        else:
            why = retry_reason(error, state, _policy_settings())
        if decision.action is Action.RETRY:
            logger.info(
                "agent %s turn %s: %s (%s); calling again in %.0f ms",
                turn.agent.name,
                turn_id,
                error.type,
                error.message[:200],
                decision.delay_ms,
            )
            # Kept on the turn before the wait: a worker that runs it next honours it too.
            await bookkeeping(pace, turn, delay_ms=decision.delay_ms, reason=why, lease=lease)
            if not await _sleep_unless_cancelled(turn, decision.delay_ms / 1000, lease):
                return _STOPPED
            continue
        if error.retry_after_ms is not None and ended.binding is None:
            # A terminal failure keeps its disposition; the wait it stated binds what follows.
            await bookkeeping(record_wait, turn, error, now_ms)
        if (
            decision.action is Action.EXHAUST
            and error.type != "timeout"
            and await _durably(
                f"turn {turn_id}: re-arm", partial(turn_rearm, turn=turn, error=error), lease
            )
        ):
            return _ENDED
        status = Turn.Status.EXHAUSTED if decision.action is Action.EXHAUST else Turn.Status.FAILED
        if await _durably(
            f"turn {turn_id}: end",
            partial(
                turn_fail,
                turn=turn,
                error=error,
                status=status,
                timed_out_again=decision.timed_out_again,
            ),
            lease,
        ):
            await blocking(
                breaker_after_failure, turn=turn, error=error, failed=request, holding=lease
            )
        return _ENDED


# A turn ready for its call: the turn, its request and its call, begun (``ProviderCall.begin``).
Ready = tuple[Turn, CompiledRequest, ProviderCall]

STOPPED_MID_CALL: Final = ProviderError(
    type="aborted", message="the worker making this call stopped before it ended"
)


def _taken_over(
    turn: Turn, lost_by: str, taken_by: str, aborted: int, stopped: list[InferenceCall]
) -> None:
    """Say that this run took the turn over from the run ``lost_by``, whose lease lapsed and
    which left ``aborted`` calls in flight, and trace those (``stopped``: their rows, when
    telemetry is exported) as aborted: their ends were never recorded."""
    with turn_traced(turn):
        logger.warning(
            "agent %s turn %s taken over: %s runs it now; %s left it running and its lease lapsed (that worker died, lost "
            "the database, or its run stopped on an error); %d call(s) it left in flight recorded as aborted",
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


def _turn_start(turn_id: int, status: str, lease: TurnLease) -> tuple[Turn, Ready | None] | None:
    """Claim the turn for this run (a held one only once its wait is over), and close what a
    stopped worker left open. The turn and, unless its kept pacing must run out first, what
    ``_turn_ready`` gives (both in this one hop); None when it is not this run's to go on with."""
    now = timezone.now()
    held = (
        Turn.objects.select_related("agent").filter(pk=turn_id, status=Turn.Status.HELD).first()
        if status == Turn.Status.HELD
        else None
    )
    if held is not None and hold_if_waiting(held):
        return None
    # A turn left running was another run's: the worker that ran it died, or lost its lease.
    lost_by = (
        Turn.objects.filter(pk=turn_id).values_list("claimed_by", flat=True).first()
        if status == Turn.Status.RUNNING
        else None
    )
    if not turn_claim(turn_id=turn_id, owner=lease.owner, now=now):
        return None
    # A call still "in flight" now belonged to a worker that stopped mid-call (this run holds
    # the lease, so no one else is calling): record it as aborted, not leave it open forever.
    # Only a turn left running has one (a queued or held turn's calls all ended).
    stopped: list[InferenceCall] = []
    aborted = 0
    if status == Turn.Status.RUNNING:
        open_calls = InferenceCall.objects.filter(turn_id=turn_id, outcome__isnull=True)
        if telemetry.enabled:
            stopped = list(open_calls)
        aborted = open_calls.update(
            outcome=InferenceCall.Outcome.ABORTED, ended_at=now, error=STOPPED_MID_CALL.as_dict()
        )
        if lost_by and lost_by != lease.owner:
            turn_noted(
                turn_id,
                "agentops.turn.taken_over",
                {"agentops.lease.lost_by": lost_by, "agentops.lease.taken_by": lease.owner},
            )
    turn = _turn_loaded(turn_id)
    if lost_by and lost_by != lease.owner:
        _taken_over(turn, lost_by, lease.owner, aborted, stopped)
    if held is not None:
        _resumed(turn, held)
    if held is not None and (release_pacing_ms := pacing_left_ms(turn)) > paced_left_ms(turn):
        # A release lifted a 429's wait: the next call still keeps the 429's own pacing.
        pace(turn, delay_ms=release_pacing_ms, reason="pacing after a 429", lease=lease)
    if paced_left_ms(turn) > 0:
        return turn, None
    ready = _ready(turn)
    return (turn, ready) if ready is not None else None


def _turn_ready(turn_id: int) -> Ready | None:
    """The running turn, its request compiled from its presented rows and its call started
    (``ProviderCall.begin``), at the last moment before the call: None when it is no longer running,
    or the admission check holds it."""
    return _ready(_turn_loaded(turn_id))


def _ready(turn: Turn) -> Ready | None:
    if turn.status != Turn.Status.RUNNING or hold_if_waiting(turn):
        return None
    presented = rows.instances(
        _sql().presented, [turn.agent_id, HistoryRow.State.PRESENTED.value], HistoryRow
    )
    request = compile_request(turn.agent, presented)
    # The call's start (its row, sent_at now) in this same hop: it is sent as soon as this returns.
    call = ProviderCall(turn.agent, request, InferenceCall.Kind.PRIMARY, turn=turn)
    call.begin()
    return turn, request, call


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


async def _turn_status(turn_id: int, lease: TurnLease) -> str:
    return await _durably(f"turn {turn_id}: read its status", partial(_status_of, turn_id), lease)


def _status_of(turn_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute(_STATUS_SQL, [turn_id])
        found = cursor.fetchone()
    if found is None:
        raise Turn.DoesNotExist(f"turn {turn_id}")
    return str(found[0])


async def _durably(what: str, fn: Callable[[], T], lease: TurnLease | None) -> T:
    """Bookkeeping after a call: retried while the database is down (``durable.durably``),
    in the bookkeeping pool."""
    return await bookkeeping(durably, what, fn, lease)


async def _sleep_unless_cancelled(turn: Turn, seconds: float, lease: TurnLease) -> bool:
    """Wait before a retry (the process's renewer keeps the lease meanwhile); False if its
    lease was lost meanwhile, or the worker is shutting down (the turn is handed back).

    A cancel is noticed through the process's one abort subscription, and a lost lease through
    the renewer, not by polling the database or the lease from every waiting turn."""
    engine = background_loop()
    woken = LoopWake(engine.loop)  # by a cancel, the lease's loss, or the worker's warm shutdown
    unwatch = engine.watch_cancel(cancel_key(turn), woken.set)
    lifecycle.wake_on_shutdown(woken)
    unwake = lease.wake_on_loss(woken)
    try:
        await asyncio.wait([woken.future], timeout=seconds)
    finally:
        unwake()
        lifecycle.forget(woken)
        unwatch()
    if lifecycle.stopping.is_set():
        # Warm shutdown: hand the turn back without a call; the next worker takes it, not
        # before the pacing kept on the turn.
        await _durably(f"turn {turn.pk}: hand back", lambda: turn_hand_back(turn=turn), lease)
        return False
    # Whether it was cancelled meanwhile is read where its next call starts (``_turn_ready``).
    return not lease.lost


class _CallEnded:
    """A turn's call as it ended, and what the hop that recorded it found in the same hop:
    whether a stated wait it gave binds (``binding``: None when it gave none); for an answer,
    whether it was stored and the agent's next turn; else the turn's status."""

    __slots__ = (
        "agent_id",
        "answered",
        "binding",
        "call",
        "completed",
        "lease",
        "next",
        "result",
        "status",
        "turn",
        "unstorable",
    )

    def __init__(self, turn: Turn, lease: TurnLease) -> None:
        self.turn, self.agent_id, self.lease = turn, turn.agent_id, lease
        self.binding: bool | None = None
        self.completed = self.answered = False
        self.unstorable: BaseException | None = (
            None  # why the answer that arrived could not be stored
        )
        self.status: str | None = None
        self.next: tuple[int, str] | None = _NOT_LOOKED
        self.result: CallResult
        self.call: InferenceCall

    def settle(self, call: ProviderCall) -> None:
        """In one bookkeeping hop once the call ended. Decide before you write: a wait the
        provider stated goes to the journal's write path first, before the call's row is
        written (``binding``: whether it binds; a failed write is a pending act that binds in
        this process at once); then the row (retried while the database is down), the call's
        end announced, and the answer stored (with the agent's next turn looked up) or the
        turn's status read."""
        turn, lease = self.turn, self.lease
        result = call.result
        assert result is not None
        self.result = result
        self.completed = result.outcome == "completed" and result.output is not None
        error = result.error
        if (
            error is not None
            and error.retry_after_ms is not None
            and turn.agent.kind != Agent.Kind.EPHEMERAL
        ):
            self.binding = record_wait(turn, error, time.time() * 1000)
        self.call = durably(f"turn {turn.pk}: record its call", call.record, lease)
        call.announce()
        output = result.output
        if not self.completed:
            self.status = durably(
                f"turn {turn.pk}: read its status", partial(_status_of, turn.pk), lease
            )
        elif (
            output is not None
            and (output.text or output.tool_calls or output.stop_reason != "max_tokens")
            and not lease.lost
        ):
            try:
                durably(
                    f"turn {turn.pk}: store the answer",
                    partial(turn_complete, turn=turn, output=output),
                    lease,
                )
            except UNSTORABLE as exc:
                self.unstorable = exc  # the run ends the turn: never a call again for this answer
                return
            self.answered = True
            self.next = durably(
                f"agent {self.agent_id}: find its next turn",
                lambda: next_turn(self.agent_id, now=timezone.now()),
                lease,
            )


async def _call_once(turn: Turn, call: ProviderCall, lease: TurnLease) -> _CallEnded:
    """Make the turn's call (begun in the hop that readied the turn), aborted if its lease is
    lost or the turn cancelled, and settle it in one hop (``_CallEnded.settle``)."""
    ended = _CallEnded(turn, lease)
    await call.perform(
        watch=Watch(
            abort_key=cancel_key(turn), holding=lease, abort_on_shutdown=False, turn_events=True
        )
    )
    await bookkeeping(ended.settle, call)
    return ended
