"""Running an agent's turns: one at a time per agent, across any number of workers (DESIGN §5.1).

Exclusivity is the agent's turn lease (inference.lease): a drain runs the agent's turns only
while it holds the lease, renewing it as it goes. A worker that dies stops renewing; the lease
lapses and the next delivery (the beat sweep, or the broker redelivering the task) resumes the
turn it left ``running``. A duplicate delivery finds the lease held, or the turn ended, and
does nothing.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.db.models.functions import Coalesce
from django.utils import timezone

from agentops import lifecycle
from agentops.alerts import alert_raise
from agentops.background import BackgroundLoop, background_loop
from agentops.dashboard import dashboard_call_ended, dashboard_call_started
from agentops.failures import failures_log_write
from agentops.live import broadcast_turn_event, publish_turn_event
from agentops.models import Agent, HistoryRow
from breaker.services import breaker_note_success

from .adapters import Adapter, WireRequest, build_wire
from .client import CallResult, Timeline, perform_call
from .compile import compile_request
from .config import bounds_settings
from .holds import (
    ephemeral_wait_error,
    hold_if_waiting,
    pacing_left_ms,
    record_wait,
    stated_wait,
)
from .lease import TurnLease, lease_claim
from .models import InferenceCall, Turn
from .notes import failure_note_text
from .policy import Action, Decision, PolicySettings, RetryState, decide
from .probe import breaker_after_failure
from .records import call_record
from .services import cancel_key, history_append, schedule_drain
from .types import CallOutput, CompiledRequest, ProviderError

logger = logging.getLogger(__name__)


def next_turn_id(agent_id: int, *, now: datetime) -> int | None:
    """The agent's next turn to run, or None. Turns run in order: a turn waiting for tool
    results blocks the turns behind it (their request would carry a tool call without its
    result), and so does a queued turn that may not run before a later instant (a re-arm).
    A held turn is returned: running it starts with the admission check."""
    first = (
        Turn.objects.filter(agent_id=agent_id, status__in=[Turn.Status.QUEUED, Turn.Status.RUNNING, Turn.Status.HELD, Turn.Status.REQUIRES_ACTION])
        .order_by("id")
        .values("id", "status", "not_before")
        .first()
    )
    if first is None or first["status"] == Turn.Status.REQUIRES_ACTION:
        return None
    if first["status"] == Turn.Status.QUEUED and first["not_before"] is not None and first["not_before"] > now:
        return None
    return int(first["id"])


# Turn bookkeeping (ORM work) runs in at most this many threads of a process at once; the
# other turns' threads wait on their calls without the GIL. So when a thousand calls are cut
# together, their bookkeeping queues here instead of starving the loop that times the cuts.
_BOOKKEEPING = threading.BoundedSemaphore(int(os.environ.get("AGENTOPS_BOOKKEEPING_THREADS", "2")))


@contextmanager
def _released_bookkeeping() -> Iterator[None]:
    """Let other turns do their bookkeeping while this thread waits."""
    _BOOKKEEPING.release()
    try:
        yield
    finally:
        _BOOKKEEPING.acquire()


def agent_drain(agent_id: int) -> None:
    """Run the agent's queued turns in order while this invocation holds its lease."""
    if lifecycle.stopping.is_set():
        return  # a worker shutting down takes no new turns; the sweep re-enqueues them
    with _BOOKKEEPING:
        # Renewals happen while this thread has let go of the gate (it waits on a call).
        lease = lease_claim(agent_id, gate=_BOOKKEEPING)
        if lease is None:
            logger.debug("agent %s: another worker holds its turn lease", agent_id)
            return
        try:
            while not lease.lost and not lifecycle.stopping.is_set() and (turn_id := next_turn_id(agent_id, now=timezone.now())) is not None:
                turn_run(turn_id, lease)
                if _turn_status(turn_id) == Turn.Status.HELD:
                    break  # its re-check is scheduled; the turns behind it wait with it
        finally:
            lease.release()
            connection.close()


def _policy_settings() -> PolicySettings:
    return PolicySettings(
        deadline_retry_delay_ms=settings.AGENTOPS_DEADLINE_RETRY_DELAY_MS,
        pacing_floor_ms=settings.AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS,
        retry_episode_ms=settings.AGENTOPS_RETRY_EPISODE_MS,
    )


def turn_run(turn_id: int, lease: TurnLease) -> None:
    """Run one turn's rounds until it succeeds, fails, needs tool results, is held by a
    provider wait or is cancelled. Call only while holding the agent's turn lease."""
    now = timezone.now()
    held = Turn.objects.select_related("agent").filter(pk=turn_id, status=Turn.Status.HELD).first()
    if held is not None and hold_if_waiting(held):
        return
    claimed = Turn.objects.filter(pk=turn_id, status__in=[Turn.Status.QUEUED, Turn.Status.RUNNING, Turn.Status.HELD]).update(
        status=Turn.Status.RUNNING,
        claimed_by=lease.owner,
        started_at=Coalesce(F("started_at"), now),
        attempts=F("attempts") + 1,
        hold_until=None,
        hold_reason="",
    )
    if not claimed:
        return
    # A call still "in flight" now belonged to a worker that stopped mid-call (this drain holds
    # the lease, so no one else is calling): record it as aborted, not leave it open forever.
    InferenceCall.objects.filter(turn_id=turn_id, outcome__isnull=True).update(
        outcome=InferenceCall.Outcome.ABORTED,
        ended_at=now,
        error=ProviderError(type="aborted", message="the worker making this call stopped before it ended").as_dict(),
    )
    broadcast_turn_event(turn_id, {"type": "turn.status", "turn": turn_id, "status": Turn.Status.RUNNING})
    turn = Turn.objects.select_related("agent").get(pk=turn_id)
    if held is not None and not _sleep_unless_cancelled(turn, pacing_left_ms(turn) / 1000, lease):
        return
    # The count of consecutive cuts starts at zero with each turn, except that a re-armed turn
    # gets no fresh call for a cut before one of its rounds has run (DESIGN §5.7).
    state = RetryState(consecutive_cuts=1 if turn.rearms else 0)
    rng = random.Random()
    while True:
        turn = Turn.objects.select_related("agent__provider").get(pk=turn_id)
        if turn.status != Turn.Status.RUNNING or hold_if_waiting(turn):
            return
        result, call, request = _call_once(turn, lease)
        if lease.lost or _turn_status(turn_id) != Turn.Status.RUNNING:
            return  # cancelled while the call was out (never turned into a retry), or lease lost
        if result.outcome == "completed" and result.output is not None:
            output = result.output
            if not output.text and not output.tool_calls and output.stop_reason == "max_tokens":
                error = ProviderError(
                    type="unknown",
                    provider_code="empty_length_stop",
                    message="the model stopped at its output limit with no text and no tool call; the same request would run away again",
                )
                InferenceCall.objects.filter(pk=call.pk).update(outcome=InferenceCall.Outcome.ERROR, error=error.as_dict())
                if _turn_fail(turn, error, status=Turn.Status.FAILED, timed_out_again=False):
                    breaker_after_failure(turn=turn, error=error, failed=request, keep_going=lease.renew_if_due, waiting=_released_bookkeeping)
                return
            _turn_complete(turn, output)
            return
        error = result.error or ProviderError(type="unknown", message="the call failed without an error")
        now_ms = time.time() * 1000
        decision, state = decide(error, state, now_ms=now_ms, settings=_policy_settings(), jitter=rng.random())
        if decision.action is Action.HOLD:
            delay_ms = stated_wait(turn, error, now_ms)
            if delay_ms is None:
                continue  # recorded: the admission check at the top of the loop holds the turn
            if delay_ms < 0:  # an ephemeral run's wait too long to sleep: it ends now
                _turn_fail(turn, ephemeral_wait_error(error), status=Turn.Status.EXHAUSTED, timed_out_again=False)
                return
            decision = Decision(Action.RETRY, delay_ms=delay_ms)
        if decision.action is Action.RETRY:
            logger.info(
                "agent %s turn %s: %s (%s); calling again in %.0f ms",
                turn.agent.name, turn_id, error.type, error.message[:200], decision.delay_ms,
            )
            if not _sleep_unless_cancelled(turn, decision.delay_ms / 1000, lease):
                return
            continue
        if error.retry_after_ms is not None:
            # A terminal failure keeps its disposition; the wait it stated binds what follows.
            record_wait(turn, error, now_ms)
        if decision.action is Action.EXHAUST and error.type != "timeout" and _turn_rearm(turn, error):
            return
        status = Turn.Status.EXHAUSTED if decision.action is Action.EXHAUST else Turn.Status.FAILED
        if _turn_fail(turn, error, status=status, timed_out_again=decision.timed_out_again):
            breaker_after_failure(turn=turn, error=error, failed=request, keep_going=lease.renew_if_due, waiting=_released_bookkeeping)
        return


def _turn_status(turn_id: int) -> str:
    return str(Turn.objects.values_list("status", flat=True).get(pk=turn_id))


def _sleep_unless_cancelled(turn: Turn, seconds: float, lease: TurnLease) -> bool:
    """Wait before a retry, renewing the lease; False if the turn was cancelled meanwhile.

    A cancel is noticed through the process's one cancel poller, not by polling the database
    from every waiting thread."""
    connection.close()  # back to the pool while this thread waits
    woken = threading.Event()  # by a cancel, or by the worker's warm shutdown
    loop = background_loop()
    unwatch = loop.submit(_watch(loop, cancel_key(turn), woken.set)).result()
    lifecycle.wake_on_shutdown(woken)
    try:
        with _released_bookkeeping():
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:
                if woken.wait(min(left, settings.AGENTOPS_TURN_LEASE_MS / 4000)) or not lease.renew_if_due():
                    break
    finally:
        lifecycle.forget(woken)
        loop.loop.call_soon_threadsafe(unwatch)
    if lifecycle.stopping.is_set():
        # Warm shutdown: hand the turn back without a call; the next worker takes it.
        if Turn.objects.filter(pk=turn.pk, status=Turn.Status.RUNNING).update(status=Turn.Status.QUEUED):
            logger.warning("agent %s turn %s handed back: the worker is shutting down", turn.agent.name, turn.pk)
            broadcast_turn_event(turn.pk, {"type": "turn.status", "turn": turn.pk, "status": Turn.Status.QUEUED})
        connection.close()
        return False
    connection.close()
    return not lease.lost and _turn_status(turn.pk) == Turn.Status.RUNNING


async def _watch(loop: BackgroundLoop, key: str, callback: Callable[[], None]) -> Callable[[], None]:
    return loop.watch_cancel(key, callback)


def _call_once(turn: Turn, lease: TurnLease) -> tuple[CallResult, InferenceCall, CompiledRequest]:
    agent = turn.agent
    rows = list(HistoryRow.objects.filter(agent=agent, state=HistoryRow.State.PRESENTED).order_by("seq"))
    request = compile_request(agent, rows)
    adapter, wire = build_wire(agent.provider, request)
    call = InferenceCall.objects.create(
        turn=turn, agent=agent, kind=InferenceCall.Kind.PRIMARY, model=request.model,
        streamed=request.stream, max_tokens=request.max_tokens, round=turn.rounds, sent_at=timezone.now(),
    )
    dashboard_call_started(call=call, agent=agent.name)
    # The call runs on the process's engine loop; this thread keeps the lease and waits. Its
    # database connection goes back to the pool for the duration.
    connection.close()
    engine = background_loop()
    aborts: list[Callable[[], None]] = []
    future = engine.submit(_perform(turn, call, adapter, wire, request.stream, request.max_tokens, aborts))
    with _released_bookkeeping():
        while True:
            try:
                result = future.result(timeout=settings.AGENTOPS_TURN_LEASE_MS / 4000)
                break
            except FutureTimeout:
                if not lease.renew_if_due():
                    for abort in aborts:
                        engine.loop.call_soon_threadsafe(abort)
    call_record(call, result)
    broadcast_turn_event(turn.pk, {"type": "call.ended", "turn": turn.pk, "call": call.pk, "outcome": result.outcome})
    dashboard_call_ended(call=call, agent=agent.name, result=result)
    return result, call, request


async def _perform(
    turn: Turn, call: InferenceCall, adapter: Adapter, wire: WireRequest, streamed: bool, max_tokens: int | None,
    aborts: list[Callable[[], None]],
) -> CallResult:
    engine = background_loop()
    turn_id = turn.pk
    unwatch: Callable[[], None] = lambda: None  # noqa: E731

    def on_abortable(abort: Callable[[], None]) -> None:
        nonlocal unwatch
        aborts.append(abort)
        unwatch = engine.watch_cancel(cancel_key(turn), abort)

    async def on_milestone(name: str, timeline: Timeline) -> None:
        if name == "sent":
            publish_turn_event(turn_id, {"type": "call.started", "turn": turn_id, "call": call.pk, "model": call.model, "streamed": streamed})

    async def on_delta(text: str) -> None:
        publish_turn_event(turn_id, {"type": "call.delta", "turn": turn_id, "call": call.pk, "text": text})

    try:
        return await perform_call(
            adapter=adapter, wire=wire, streamed=streamed, max_tokens=max_tokens,
            bounds=bounds_settings(), on_delta=on_delta, on_abortable=on_abortable, on_milestone=on_milestone,
            client=engine.http,
        )
    finally:
        unwatch()


def _turn_complete(turn: Turn, output: CallOutput) -> None:
    now = timezone.now()
    with transaction.atomic():
        locked = Turn.objects.select_for_update().get(pk=turn.pk)
        if locked.status != Turn.Status.RUNNING:
            return
        agent = Agent.objects.select_for_update().get(pk=turn.agent_id)
        history_append(agent=agent, participant=agent.participant, role=HistoryRow.Role.ASSISTANT, content=output.blocks)
        breaker_note_success(agent=agent)
        calls = output.tool_calls
        locked.output = {"content": output.text, "stop_reason": output.stop_reason, "tool_calls": calls}
        locked.rounds += 1
        locked.error = None
        if calls:
            locked.status = Turn.Status.REQUIRES_ACTION
            locked.pending_tool_calls = calls
        else:
            locked.status = Turn.Status.SUCCEEDED
            locked.ended_at = now
        locked.save(update_fields=["output", "rounds", "error", "status", "pending_tool_calls", "ended_at"])
        broadcast_turn_event(turn.pk, {"type": "turn.status", "turn": turn.pk, "status": locked.status})
        if locked.status == Turn.Status.SUCCEEDED:
            broadcast_turn_event(turn.pk, {"type": "turn.ended", "turn": turn.pk, "status": locked.status})


def _turn_rearm(turn: Turn, error: ProviderError) -> bool:
    """Queue an exhausted turn to be sent again after the next delay of the ladder.
    Returns False when the ladder is spent."""
    ladder = settings.AGENTOPS_REARM_DELAYS_MS
    if turn.rearms >= len(ladder):
        return False
    delay_ms = ladder[turn.rearms]
    not_before = timezone.now() + timedelta(milliseconds=delay_ms)
    updated = Turn.objects.filter(pk=turn.pk, status=Turn.Status.RUNNING).update(
        status=Turn.Status.QUEUED, rearms=F("rearms") + 1, not_before=not_before, error=error.as_dict(),
        hold_reason=f"re-armed after {error.type}: sent again at {not_before:%H:%M:%S} UTC ({turn.rearms + 1} of {len(ladder)})",
    )
    if updated:
        logger.warning(
            "agent %s turn %s exhausted by %s; sending it again in %.0f s (%s of %s)",
            turn.agent.name, turn.pk, error.type, delay_ms / 1000, turn.rearms + 1, len(ladder),
        )
        broadcast_turn_event(turn.pk, {"type": "turn.status", "turn": turn.pk, "status": Turn.Status.QUEUED})
        schedule_drain(turn.agent_id, delay_ms / 1000)
    return bool(updated)


def _turn_fail(turn: Turn, error: ProviderError, *, status: str, timed_out_again: bool) -> bool:
    """End a running turn in failure with its note and incident. False if it was no longer
    running (cancelled meanwhile)."""
    now = timezone.now()
    with transaction.atomic():
        locked = Turn.objects.select_for_update().get(pk=turn.pk)
        if locked.status != Turn.Status.RUNNING:
            return False
        agent = Agent.objects.select_for_update().get(pk=turn.agent_id)
        note = history_append(
            agent=agent, participant="agentops", role=HistoryRow.Role.SYSTEM_NOTE,
            content=failure_note_text(error, timed_out_again=timed_out_again),
        )
        locked.status = status
        locked.error = error.as_dict()
        locked.note = note
        locked.ended_at = now
        locked.save(update_fields=["status", "error", "note", "ended_at"])
        logger.warning(
            "agent %s turn %s %s: %s (%s, HTTP %s)", agent.name, turn.pk, status, error.message[:300], error.type, error.http_status,
        )
        # The incident record, in this transaction: a rolled-back ending leaves none. An exhausted
        # turn is an alert (DESIGN §8: row, failures.log line, dashboard, webhooks); a failed one
        # is only logged (its note and the breaker's streak tell the rest).
        message = f"turn {turn.pk} {status}: {error.message}"
        incident = {"turn": turn.pk, "rearms": locked.rearms, "error": error.as_dict()}
        if status == Turn.Status.EXHAUSTED:
            alert_raise(kind="turn-exhausted", agent=agent.name, model=agent.model, message=message, data=incident)
        else:
            agent_name, model = agent.name, agent.model
            transaction.on_commit(lambda: failures_log_write(kind="turn-failed", agent=agent_name, model=model, message=message, **incident))
        broadcast_turn_event(turn.pk, {"type": "turn.status", "turn": turn.pk, "status": status})
        broadcast_turn_event(turn.pk, {"type": "turn.ended", "turn": turn.pk, "status": status})
    return True
