"""One turn's run, as explicit steps (architecture.md §2, "One turn through the runtime").

``TurnRun.run`` goes from step to step until the turn ends, is held or stops:

- ``START``: claim the turn for this run (a held one only once its wait is over) and close what
  a stopped worker left open; then the pacing kept on the turn, if any (``WAIT``).
- ``ADMIT``: at the last moment before the call, the admission check (a binding provider wait
  holds the turn: ``HELD``), and the request compiled from the presented history.
- ``CALL``: the call, on the loop, aborted by a cancel or the lease's loss.
- ``SETTLE``: a stated wait recorded first, then the call's row; an answer stored, or the
  failure decided by the retry policy: pace and ``WAIT``, hold (``ADMIT`` holds it), or end.
- ``WAIT``: sleep before the next call, woken by a cancel, the lease's loss or a warm shutdown.

Each step is one method on the runtime's loop; each touches the database in hops through the
runtime (``_durably``: retried while the database is down and the lease is this run's). Run
only while holding the agent's turn lease.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Final, TypeVar

from django.conf import settings
from django.utils import timezone

from agentops.budgets import budget_hold_tightest
from agentops.models import Agent
from agentops.runtime import Wake
from calls.run import ProviderCall
from calls.types import CallOutput, CompiledRequest, ProviderError
from calls.watch import Watch
from inference.models import InferenceCall, Turn
from turns.after_failure import breaker_after_failure
from turns.durable import offer_pending_waits, pace, paced_left_ms, retry_reason
from turns.holds import (
    ephemeral_sleep_ms,
    ephemeral_wait_error,
    hold_for_project_limit,
    own_pacing_ms,
    record_wait,
)
from turns.lease import TurnLease
from turns.moves import turn_fail, turn_fail_unstorable, turn_hand_back, turn_rearm
from turns.policy import Action, PolicySettings, RetryState, decide
from turns.routing import SWITCH_ON, alternates
from turns.runtime import TurnRuntime
from turns.services import cancel_key
from turns.serving import serving_switch
from turns.steps import Step
from turns.targets import Serving
from turns.tracing import turn_traced
from turns.turn_rows import (
    AnswerUnstorable,
    Outcome,
    call_settled,
    turn_ready,
    turn_resumed,
    turn_start,
)
from turns.turn_window import WindowSteps

logger = logging.getLogger(__name__)

T = TypeVar("T")

EMPTY_LENGTH_STOP: Final = ProviderError(
    type="unknown",
    provider_code="empty_length_stop",
    message="the model stopped at its output limit with no text and no tool call; "
    "the same request would run away again",
)


# A call a busy budget refused is called again after 1, 2, 4, 8, 16 and 32 times
# AGENTOPS_BUDGET_BUSY_RETRY_MS, then the budget holds (what is in flight is not settling).
BUDGET_BUSY_TRIES: Final = 6


class TurnRun(WindowSteps):
    def __init__(self, runtime: TurnRuntime, lease: TurnLease, turn_id: int, status: str) -> None:
        self.runtime, self.lease = runtime, lease
        self.turn_id, self.found_status = turn_id, status
        self.outcome = Outcome.STOPPED
        self.turn: Turn
        self.request: CompiledRequest
        self.call: ProviderCall
        self.delay_s = 0.0  # WAIT's sleep
        self.binding: bool | None = None  # whether the call's stated wait binds (None: none)
        self.retry = RetryState()
        self.serving: Serving
        self.switches = 0  # calls sent to another target at once after a failure (§6.11)
        self.busy_tries = 0  # calls a budget refused until its calls in flight settle (§18.1)
        self.need_tokens = 0  # the window's state (turns.turn_window)
        self.context_refused = False
        self.context_acts = 0
        self._steps: dict[Step, Callable[[], Awaitable[Step]]] = {
            Step.ADMIT: self.admit,
            Step.CALL: self.make_call,
            Step.SETTLE: self.settle,
            Step.WAIT: self.wait,
        }

    async def run(self) -> Outcome:
        """Run the turn's steps until it ends, is held or stops."""
        step = await self.start()
        if step is Step.END:
            return self.outcome
        with turn_traced(self.turn):
            while step is not Step.END:
                step = await self._steps[step]()
        return self.outcome

    def _end(self, outcome: Outcome) -> Step:
        self.outcome = outcome
        return Step.END

    async def _durably(self, what: str, fn: Callable[[], T]) -> T:
        return await self.runtime.db_durably(
            fn,
            what=f"turn {self.turn_id}: {what}",
            still_ours=self.lease.renew_if_due,
            recovered=offer_pending_waits,
        )

    async def start(self) -> Step:
        started = await self._durably(
            "claim it",
            partial(turn_start, self.runtime, self.turn_id, self.found_status, self.lease),
        )
        if isinstance(started, Outcome):
            return self._end(started)
        turn = self.turn = started.turn
        if started.held is not None:
            await self._durably("resume it", partial(turn_resumed, turn, started.held))
        # The count of consecutive cuts starts at zero with each turn, except that a re-armed
        # turn gets no fresh call for a cut before one of its rounds has run (§5.7).
        self.retry = RetryState(consecutive_cuts=1 if turn.rearms else 0)
        # The pacing kept on the turn (a 429's, a retry delay, a re-arm) binds whichever worker
        # runs it, after a hand-back, a crash or a release.
        self.delay_s = paced_left_ms(turn) / 1000
        return Step.WAIT if self.delay_s > 0 else Step.ADMIT

    async def admit(self) -> Step:
        ready = await self._durably(
            "ready its call",
            partial(turn_ready, self.runtime, self.turn_id, need_tokens=self.need_tokens),
        )
        if isinstance(ready, Outcome):
            return self._end(ready)
        self.turn, self.request, self.call = ready.turn, ready.request, ready.call
        self.serving = ready.serving
        return await self._fit_window()

    async def make_call(self) -> Step:
        watch = Watch(
            abort_key=cancel_key(self.turn),
            holding=self.lease,
            abort_on_shutdown=False,
            turn_events=True,
        )
        await self.call.run(watch=watch, hop=partial(self._durably, "begin its call"))
        return Step.SETTLE

    async def settle(self) -> Step:
        """Decide before you write: a stated wait goes to the journal first (a failed write is
        a pending act that binds in this process at once), then in one hop the call's row and
        the answer stored (or the turn's status read)."""
        turn, call, lease = self.turn, self.call, self.lease
        result = call.result
        assert result is not None
        error = result.error
        self.binding = None
        # A project limit's refusal (§6.14) is agentops's own: no provider wait to record.
        if error is not None and error.retry_after_ms is not None and error.limit is None:
            if turn.agent.kind != Agent.Kind.EPHEMERAL:
                self.binding = await self.runtime.db(
                    record_wait, turn, error, time.time() * 1000, **self._stated_by()
                )
        output = result.output
        completed = result.outcome == "completed" and output is not None
        answer = output if completed and output is not None and _storable(output) else None
        if lease.lost:
            answer = None  # the turn is no longer this run's to end
        try:
            status = await self._durably(
                "record its call", partial(call_settled, call, self.turn, answer=answer)
            )
        except AnswerUnstorable as exc:  # never a call again for this answer
            await self._durably(
                "end, its answer unstorable",
                partial(
                    turn_fail_unstorable, turn=turn, call_id=call.row.pk, exc=exc.__cause__ or exc
                ),
            )
            return self._end(Outcome.ENDED)
        if answer is not None:
            return self._end(Outcome.ENDED)
        # Lost, or cancelled while the call was out: never turned into a retry.
        if lease.lost or (not completed and status != Turn.Status.RUNNING):
            return self._end(Outcome.STOPPED)
        if completed:  # but no answer to store: the model ran out at its limit
            return await self._empty_stop()
        return await self._decide(
            error or ProviderError(type="unknown", message="the call failed without an error")
        )

    async def _empty_stop(self) -> Step:
        """A completed call with no answer to store: it ran out at its limit. Its row says so,
        and the turn fails (another call would stop the same way)."""
        await self._durably(
            "record the empty stop",
            partial(
                InferenceCall.objects.filter(pk=self.call.row.pk).update,
                outcome=InferenceCall.Outcome.ERROR,
                error=EMPTY_LENGTH_STOP.as_dict(),
            ),
        )
        return await self._fail(EMPTY_LENGTH_STOP, Turn.Status.FAILED, timed_out_again=False)

    async def _decide(self, error: ProviderError) -> Step:
        """A failed call: each concern in turn says the next step, or passes it on.

        1. a refusal for length: a target whose window fits, or the context trimmed (§5.9);
        2. its project's limit with no room within the threshold: held, or paced (§6.14);
        3. a budget's refusal that holds: admission holds the turn (§18.3);
        4. another target that may serve, at once (§6.11);
        5. a budget's pressure, its calls in flight or the edge: again after them, or the
           tightest budget held (§18.1, §18.4);
        6. the retry policy: held on a stated wait, retried, re-armed or failed (§5.7)."""
        now_ms = time.time() * 1000  # one instant for the whole decision
        for concern in (
            self._on_overflow,
            self._on_project_limit,
            self._on_budget_hold,
            self._on_switch,
            self._on_budget_pressure,
        ):
            if (step := await concern(error, now_ms)) is not None:
                return step
        return await self._on_policy(error, now_ms)

    async def _on_overflow(self, error: ProviderError, now_ms: float) -> Step | None:
        return await self._after_overflow(error) if error.type == "context_length" else None

    async def _on_project_limit(self, error: ProviderError, now_ms: float) -> Step | None:
        if error.limit is None:
            return None
        if self.turn.agent.kind == Agent.Kind.EPHEMERAL:  # never held (§6.9): it waits
            return await self._paced(error, error.retry_after_ms or 1000.0, "project limit")
        held = await self._durably(
            "hold it for its project's limit",
            partial(hold_for_project_limit, self.runtime.rechecks, self.turn, error),
        )
        return self._end(Outcome.HELD if held else Outcome.STOPPED)

    async def _on_budget_hold(self, error: ProviderError, now_ms: float) -> Step | None:
        # The refusal recorded the budget hold: admission now holds the turn until the period
        # resets or an operator acts. (An ephemeral run is never held.)
        if error.type == "budget" and self.turn.agent.kind != Agent.Kind.EPHEMERAL:
            return Step.ADMIT
        return None

    async def _on_switch(self, error: ProviderError, now_ms: float) -> Step | None:
        return Step.ADMIT if await self._switched(error, now_ms) else None

    async def _on_budget_pressure(self, error: ProviderError, now_ms: float) -> Step | None:
        if error.type == "budget_busy" and self.busy_tries < BUDGET_BUSY_TRIES:
            # It fits once the budget's calls in flight settle: again after them.
            delay_ms = settings.AGENTOPS_BUDGET_BUSY_RETRY_MS * 2**self.busy_tries
            self.busy_tries += 1
            return await self._paced(error, delay_ms, "the budget's calls in flight settling")
        agent = self.turn.agent
        if error.type in ("budget_edge", "budget_busy") and agent.kind != Agent.Kind.EPHEMERAL:
            # The cheaper target it was refused for cannot serve now (held or down), or the
            # calls in flight do not settle: nothing fits the budget, so it holds as if spent,
            # and admission holds the turn.
            await self._durably(
                "hold the budget", partial(budget_hold_tightest, agent=agent, now=timezone.now())
            )
            return Step.ADMIT
        return None

    async def _on_policy(self, error: ProviderError, now_ms: float) -> Step:
        policy = _policy_settings()
        decision, self.retry = decide(
            error, self.retry, now_ms=now_ms, settings=policy, jitter=random.random()
        )
        if decision.action is Action.HOLD:
            return await self._held(error, now_ms)
        if decision.action is Action.RETRY:
            return await self._paced(
                error, decision.delay_ms, retry_reason(error, self.retry, policy)
            )
        if error.retry_after_ms is not None and self.binding is None:
            # A terminal failure keeps its disposition; the wait it stated binds what follows.
            await self.runtime.db(record_wait, self.turn, error, now_ms, **self._stated_by())
        if (
            decision.action is Action.EXHAUST
            and error.type != "timeout"
            and await self._durably("re-arm", partial(turn_rearm, turn=self.turn, error=error))
        ):
            return self._end(Outcome.ENDED)
        status = Turn.Status.EXHAUSTED if decision.action is Action.EXHAUST else Turn.Status.FAILED
        return await self._fail(error, status, timed_out_again=decision.timed_out_again)

    async def _held(self, error: ProviderError, now_ms: float) -> Step:
        """The policy holds the call on a wait: recorded, the turn's admission holds it; an
        ephemeral run (which records none) sleeps it out when short, else ends."""
        if self.turn.agent.kind == Agent.Kind.EPHEMERAL:
            sleep_ms = ephemeral_sleep_ms(error)
            if sleep_ms is None:  # longer than an ephemeral run sleeps: it ends now
                return await self._fail(
                    ephemeral_wait_error(error),
                    Turn.Status.EXHAUSTED,
                    timed_out_again=False,
                    breaker=False,
                )
        else:
            if self.binding is None:
                self.binding = await self.runtime.db(
                    record_wait, self.turn, error, now_ms, **self._stated_by()
                )
            if self.binding:
                return Step.ADMIT  # its admission check holds the turn
            sleep_ms = own_pacing_ms(error)
        why = "pacing after a 429" if error.type == "rate_limit" else "the provider's stated wait"
        return await self._paced(error, sleep_ms, why)

    def _stated_by(self) -> dict[str, Any]:
        """The target a stated wait binds: the call's model on its provider (§6.11)."""
        return {"model": self.call.row.model, "provider": self.call.provider}

    async def _switched(self, error: ProviderError, now_ms: float) -> bool:
        """Whether the next call goes at once to another target than this one's: a failure
        that routes around (``SWITCH_ON``) left a target that may serve. At most once per
        target in a run, so targets failing in turn end under the retry policy."""
        agent = self.turn.agent
        listed = [*alternates(agent.pool), *alternates(agent.fallbacks)]
        if error.type not in SWITCH_ON or not listed or self.switches > len(listed):
            return False
        if error.retry_after_ms is not None and self.binding is None:
            # Its wait first: the choice reads the journal.
            self.binding = await self.runtime.db(
                record_wait, self.turn, error, now_ms, **self._stated_by()
            )
        current = self.serving.target
        failed = (current.provider.pk, current.model)
        serving = await self.runtime.db(
            serving_switch,
            self.runtime.pacer,
            self.turn.agent,
            now_ms,
            error=error,
            tried={failed},
            failed=failed,
        )
        if serving is None:
            return False
        self.switches += 1
        logger.info(
            "agent %s turn %s: %s (%s) from %s; the next call goes to %s at once (%s)",
            self.turn.agent.name,
            self.turn_id,
            error.type,
            error.message[:200],
            self.call.row.model,
            serving.target.model,
            serving.choice.reason,
        )
        return True

    async def _paced(self, error: ProviderError, delay_ms: float, why: str) -> Step:
        logger.info(
            "agent %s turn %s: %s (%s); calling again in %.0f ms",
            self.turn.agent.name,
            self.turn_id,
            error.type,
            error.message[:200],
            delay_ms,
        )
        # Kept on the turn before the wait: a worker that runs it next honours it too.
        await self._durably(
            "keep its next call's earliest instant",
            partial(pace, self.turn, delay_ms=delay_ms, reason=why),
        )
        self.delay_s = delay_ms / 1000
        return Step.WAIT

    async def _fail(
        self, error: ProviderError, status: str, *, timed_out_again: bool, breaker: bool = True
    ) -> Step:
        """End the turn failed; the breaker hears of it when this run ended it."""
        ended = await self._durably(
            "end",
            partial(
                turn_fail,
                turn=self.turn,
                error=error,
                status=status,
                timed_out_again=timed_out_again,
            ),
        )
        if ended and breaker:
            await breaker_after_failure(
                self.runtime, turn=self.turn, error=error, failed=self.request, holding=self.lease
            )
        return self._end(Outcome.ENDED)

    async def wait(self) -> Step:
        """Sleep ``delay_s`` before the next call (the runtime's renewer keeps the lease). A
        cancel is heard through the runtime's one abort subscription and a lost lease from the
        renewer, not by polling from every waiting turn."""
        runtime, lease = self.runtime, self.lease
        woken = Wake(runtime.loop)
        undo = [
            runtime.watch_cancel(cancel_key(self.turn), woken.set),
            runtime.wake_on_shutdown(woken),
            lease.wake_on_loss(woken),
        ]
        try:
            await asyncio.wait([woken.future], timeout=self.delay_s)
        finally:
            for step in undo:
                step()
        if lease.lost:  # another worker runs the turn now: nothing to hand back
            return self._end(Outcome.STOPPED)
        if runtime.stopping.is_set():
            # Warm shutdown: hand the turn back without a call; the next worker takes it, not
            # before the pacing kept on the turn.
            await self._durably("hand back", partial(turn_hand_back, turn=self.turn))
            return self._end(Outcome.STOPPED)
        # Whether it was cancelled meanwhile is read where its next call starts (ADMIT).
        return Step.ADMIT


def _storable(output: CallOutput) -> bool:
    """An answer worth storing: text, a tool call, or a stop that is not the output limit."""
    return bool(output.text or output.tool_calls or output.stop_reason != "max_tokens")


def _policy_settings() -> PolicySettings:
    return PolicySettings(
        deadline_retry_delay_ms=settings.AGENTOPS_DEADLINE_RETRY_DELAY_MS,
        pacing_floor_ms=settings.AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS,
        retry_episode_ms=settings.AGENTOPS_RETRY_EPISODE_MS,
    )
