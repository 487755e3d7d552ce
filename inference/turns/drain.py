"""Running an agent's turns: one at a time per agent, across any number of workers (DESIGN §5.1).

Exclusivity is the agent's turn lease (``inference.turns.lease``): a drain runs the agent's turns only
while it holds the lease, which the process's one renewer keeps alive. A worker that dies stops renewing; the lease
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
from contextlib import contextmanager
from datetime import datetime
from functools import partial
from typing import TypeVar

from django.conf import settings
from django.db import connection
from django.utils import timezone

from agentops import lifecycle
from agentops.background import BackgroundLoop, background_loop
from agentops.models import Agent, HistoryRow
from inference.calls.client import CallResult
from inference.calls.compile import compile_request
from inference.calls.run import call_run
from inference.calls.types import CompiledRequest, ProviderError
from inference.models import InferenceCall, Turn

from .after_failure import breaker_after_failure
from .durable import (
    LeaseLost,
    durably,
    offer_pending_waits_until,
    pace,
    paced_left_ms,
    retry_reason,
)
from .holds import ephemeral_wait_error, hold_if_waiting, pacing_left_ms, record_wait, stated_wait
from .lease import TurnLease, lease_claim
from .policy import Action, Decision, PolicySettings, RetryState, decide
from .services import cancel_key, turn_claim, turn_complete, turn_fail, turn_hand_back, turn_rearm

logger = logging.getLogger(__name__)

T = TypeVar("T")


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
        # The renewer keeps the lease; a renewal this thread makes itself (while the database
        # does not answer) is made with the gate let go.
        lease = lease_claim(agent_id, gate=_BOOKKEEPING)
        if lease is None:
            logger.debug("agent %s: another worker holds its turn lease", agent_id)
            return
        try:
            while not lease.lost and not lifecycle.stopping.is_set():
                turn_id = durably(f"agent {agent_id}: find its next turn", lambda: next_turn_id(agent_id, now=timezone.now()), lease, waiting=_released_bookkeeping)
                if turn_id is None:
                    break
                # A database error before the call goes out runs the turn again from the
                # top; every write after a call is made is retried where it is (durably).
                durably(f"agent {agent_id}: run turn {turn_id}", partial(turn_run, turn_id, lease), lease, waiting=_released_bookkeeping)
                if _turn_status(turn_id, lease) == Turn.Status.HELD:
                    break  # its re-check is scheduled; the turns behind it wait with it
        except LeaseLost:
            logger.error("agent %s: the turn lease was taken over while the database was down; this run stops", agent_id)
        finally:
            lease.release()
            connection.close()
            # A run that ends, even one whose lease was taken, hands its stated waits to the
            # journal: the run that takes over must not call before their end.
            with _released_bookkeeping():
                offer_pending_waits_until(time.monotonic() + settings.AGENTOPS_TURN_LEASE_MS / 1000)
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
    if not turn_claim(turn_id=turn_id, owner=lease.owner, now=now):
        return
    # A call still "in flight" now belonged to a worker that stopped mid-call (this drain holds
    # the lease, so no one else is calling): record it as aborted, not leave it open forever.
    InferenceCall.objects.filter(turn_id=turn_id, outcome__isnull=True).update(
        outcome=InferenceCall.Outcome.ABORTED,
        ended_at=now,
        error=ProviderError(type="aborted", message="the worker making this call stopped before it ended").as_dict(),
    )
    turn = Turn.objects.select_related("agent").get(pk=turn_id)
    if held is not None and (release_pacing_ms := pacing_left_ms(turn)) > paced_left_ms(turn):
        # A release lifted a 429's wait: the next call still keeps the 429's own pacing.
        pace(turn, delay_ms=release_pacing_ms, reason="pacing after a 429", lease=lease)
    # The pacing kept on the turn (a 429's, a retry delay, a re-arm) binds whichever worker
    # runs it, after a hand-back, a crash or a release.
    if paced_left_ms(turn) > 0 and not _sleep_unless_cancelled(turn, paced_left_ms(turn) / 1000, lease):
        return
    # The count of consecutive cuts starts at zero with each turn, except that a re-armed turn
    # gets no fresh call for a cut before one of its rounds has run (DESIGN §5.7).
    state = RetryState(consecutive_cuts=1 if turn.rearms else 0)
    rng = random.Random()
    while True:
        turn = Turn.objects.select_related("agent__provider").get(pk=turn_id)
        if turn.status != Turn.Status.RUNNING or hold_if_waiting(turn):
            return
        decided: dict[str, bool] = {}
        result, call, request = _call_once(turn, lease, decided)
        if lease.lost or _turn_status(turn_id, lease) != Turn.Status.RUNNING:
            return  # cancelled while the call was out (never turned into a retry), or lease lost
        if result.outcome == "completed" and result.output is not None:
            output = result.output
            if not output.text and not output.tool_calls and output.stop_reason == "max_tokens":
                error = ProviderError(
                    type="unknown",
                    provider_code="empty_length_stop",
                    message="the model stopped at its output limit with no text and no tool call; the same request would run away again",
                )
                _durably(f"call {call.pk}: record the empty stop", partial(InferenceCall.objects.filter(pk=call.pk).update, outcome=InferenceCall.Outcome.ERROR, error=error.as_dict()), lease)
                if _durably(f"turn {turn_id}: fail", partial(turn_fail, turn=turn, error=error, status=Turn.Status.FAILED, timed_out_again=False), lease):
                    breaker_after_failure(turn=turn, error=error, failed=request, holding=lease, waiting=_released_bookkeeping)
                return
            _durably(f"turn {turn_id}: store the answer", partial(turn_complete, turn=turn, output=output), lease)
            return
        error = result.error or ProviderError(type="unknown", message="the call failed without an error")
        now_ms = time.time() * 1000
        decision, state = decide(error, state, now_ms=now_ms, settings=_policy_settings(), jitter=rng.random())
        if decision.action is Action.HOLD:
            delay_ms = stated_wait(turn, error, now_ms, recorded=decided.get("binding"))
            if delay_ms is None:
                continue  # recorded: the admission check at the top of the loop holds the turn
            if delay_ms < 0:  # an ephemeral run's wait too long to sleep: it ends now
                _durably(f"turn {turn_id}: end", partial(turn_fail, turn=turn, error=ephemeral_wait_error(error), status=Turn.Status.EXHAUSTED, timed_out_again=False), lease)
                return
            decision = Decision(Action.RETRY, delay_ms=delay_ms)
            why = "pacing after a 429" if error.type == "rate_limit" else "the provider's stated wait"
        else:
            why = retry_reason(error, state, _policy_settings())
        if decision.action is Action.RETRY:
            logger.info(
                "agent %s turn %s: %s (%s); calling again in %.0f ms",
                turn.agent.name, turn_id, error.type, error.message[:200], decision.delay_ms,
            )
            # Kept on the turn before the wait: a worker that runs it next honours it too.
            pace(turn, delay_ms=decision.delay_ms, reason=why, lease=lease, waiting=_released_bookkeeping)
            if not _sleep_unless_cancelled(turn, decision.delay_ms / 1000, lease):
                return
            continue
        if error.retry_after_ms is not None and "binding" not in decided:
            # A terminal failure keeps its disposition; the wait it stated binds what follows.
            record_wait(turn, error, now_ms)
        if decision.action is Action.EXHAUST and error.type != "timeout" and _durably(f"turn {turn_id}: re-arm", partial(turn_rearm, turn=turn, error=error), lease):
            return
        status = Turn.Status.EXHAUSTED if decision.action is Action.EXHAUST else Turn.Status.FAILED
        if _durably(f"turn {turn_id}: end", partial(turn_fail, turn=turn, error=error, status=status, timed_out_again=decision.timed_out_again), lease):
            breaker_after_failure(turn=turn, error=error, failed=request, holding=lease, waiting=_released_bookkeeping)
        return


def _turn_status(turn_id: int, lease: TurnLease | None = None) -> str:
    return str(_durably(f"turn {turn_id}: read its status", lambda: Turn.objects.values_list("status", flat=True).get(pk=turn_id), lease))


def _durably(what: str, fn: Callable[[], T], lease: TurnLease | None) -> T:
    """Bookkeeping after a call: retried while the database is down (``durable.durably``),
    letting other turns do theirs while this one waits."""
    return durably(what, fn, lease, waiting=_released_bookkeeping)


def _sleep_unless_cancelled(turn: Turn, seconds: float, lease: TurnLease) -> bool:
    """Wait before a retry (the process's renewer keeps the lease meanwhile); False if the
    turn was cancelled or its lease lost meanwhile.

    A cancel is noticed through the process's one abort subscription, and a lost lease through
    the renewer, not by polling the database or the lease from every waiting thread."""
    connection.close()  # back to the pool while this thread waits
    woken = threading.Event()  # by a cancel, the lease's loss, or the worker's warm shutdown
    loop = background_loop()
    unwatch = loop.submit(_watch(loop, cancel_key(turn), woken.set)).result()
    lifecycle.wake_on_shutdown(woken)
    unwake = lease.wake_on_loss(woken)
    try:
        with _released_bookkeeping():
            woken.wait(seconds)
    finally:
        unwake()
        lifecycle.forget(woken)
        loop.loop.call_soon_threadsafe(unwatch)
    if lifecycle.stopping.is_set():
        # Warm shutdown: hand the turn back without a call; the next worker takes it, not
        # before the pacing kept on the turn.
        _durably(f"turn {turn.pk}: hand back", lambda: turn_hand_back(turn=turn), lease)
        connection.close()
        return False
    connection.close()
    return not lease.lost and _turn_status(turn.pk, lease) == Turn.Status.RUNNING


async def _watch(loop: BackgroundLoop, key: str, callback: Callable[[], None]) -> Callable[[], None]:
    return loop.watch_cancel(key, callback)


def _call_once(turn: Turn, lease: TurnLease, decided: dict[str, bool]) -> tuple[CallResult, InferenceCall, CompiledRequest]:
    """Compile the turn's request from its presented rows and make the call, renewing the
    lease while it is out (a lost lease aborts it, as does a cancel).

    Decide before you write: a wait the provider stated goes to the journal's write path as
    soon as the call ends, before the call's row is written (``decided["binding"]``: whether
    it binds); a failed write is a pending act that binds in this process at once."""

    def on_result(result: CallResult) -> None:
        error = result.error
        if error is not None and error.retry_after_ms is not None and turn.agent.kind != Agent.Kind.EPHEMERAL:
            decided["binding"] = record_wait(turn, error, time.time() * 1000)

    agent = turn.agent
    rows = list(HistoryRow.objects.filter(agent=agent, state=HistoryRow.State.PRESENTED).order_by("seq"))
    request = compile_request(agent, rows)
    call, result = call_run(
        agent=agent, request=request, kind=InferenceCall.Kind.PRIMARY, turn=turn, abort_key=cancel_key(turn),
        holding=lease, waiting=_released_bookkeeping, abort_on_shutdown=False, turn_events=True,
        on_result=on_result, record=lambda write: _durably(f"turn {turn.pk}: record its call", write, lease),
    )
    return result, call, request
