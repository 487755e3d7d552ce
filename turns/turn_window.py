"""A turn's run fitting its model's window (architecture.md §5.9, §6.11): before the call, when
the estimate is over the known window, and after a refusal for length: a target with a larger
window first, else the oldest rows set aside (summarized first under ``summarize``). The
window's steps of ``turns.turn_run.TurnRun``, which carries the state they read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Final, TypeVar

from agentops.models import Agent
from calls.types import ProviderError
from inference.models import Turn
from turns.context.services import (
    Plan,
    context_learn,
    context_plan,
    context_set_aside,
    too_big_error,
)
from turns.context.summary import context_summary
from turns.routing import overflow_need
from turns.runtime import TurnRuntime
from turns.serving import serving_choose
from turns.steps import Step
from turns.targets import Serving, routed

T = TypeVar("T")

# Acts on the window in one run, at most: each sets rows aside, so more would mean the estimate
# and the rows disagree; the call then goes as it is and the provider decides.
MAX_CONTEXT_ACTS: Final = 3


class WindowSteps:
    """The window's part of a turn's run. ``need_tokens``: the tokens a request needs when an
    alternate with a larger window serves it instead of a trim (0: no such need);
    ``context_refused``: one refused call per episode; ``context_acts``: a few acts per run."""

    turn: Turn
    runtime: TurnRuntime
    serving: Serving
    need_tokens: int = 0
    context_refused: bool = False
    context_acts: int = 0

    if TYPE_CHECKING:

        async def _durably(self, what: str, fn: Callable[[], T]) -> T: ...

        async def _fail(
            self, error: ProviderError, status: str, *, timed_out_again: bool, breaker: bool = True
        ) -> Step: ...

    async def _fit_window(self) -> Step:
        """Before the call: when the estimate plus the answer's reserve is over the known window,
        act per the agent's policy and compile the request again (``ADMIT``)."""
        if self.context_acts >= MAX_CONTEXT_ACTS or (
            self.need_tokens and self.serving.on_alternate
        ):
            return Step.CALL  # (an alternate chosen for its larger window serves as it is)
        plan = await self._durably("fit its window", partial(context_plan, turn=self.turn))
        # A turn that alone seems too big goes as it is: only the provider's refusal, not an
        # estimate, fails a turn.
        if plan is None or plan.act == "too_big":
            return Step.CALL
        return await self._context_act(plan)

    async def _after_overflow(self, error: ProviderError) -> Step | None:
        """A refusal for length: learn the window it states, then (once per episode) act and
        retry; None leaves the failure to the retry policy (terminal)."""
        await self._durably(
            "learn its window", partial(context_learn, agent=self.turn.agent, error=error)
        )
        if self.context_refused:
            return None
        self.context_refused = True
        # A larger window first, whatever the policy: the request counts as at least the window
        # the refusal stated, not as our estimate of it (§6.11).
        current = self.serving.target
        floor = overflow_need(
            error.context_limit,
            self.turn.agent.known_window
            if not self.serving.on_alternate
            else current.context_window,
        )
        if floor is not None and await self._wider_alternate(floor):
            return Step.ADMIT
        plan = await self._durably(
            "fit its window",
            partial(context_plan, turn=self.turn, refused=error),
        )
        return None if plan is None else await self._context_act(plan, refused=error)

    async def _context_act(self, plan: Plan, refused: ProviderError | None = None) -> Step:
        """Set the plan's rows aside (summarized first under ``summarize``) and compile again; a
        turn whose own rows do not fit fails saying so, nothing set aside. An alternate whose
        window the request fits comes first (§6.11): then nothing is set aside."""
        need = plan.estimate + plan.reserve
        if refused is not None:
            need = max(need, overflow_need(refused.context_limit, plan.window) or 0)
        if await self._wider_alternate(need):
            return Step.ADMIT
        if plan.act == "too_big":
            error = too_big_error(plan, refused)
            return await self._fail(error, Turn.Status.FAILED, timed_out_again=False)
        self.context_acts += 1
        summary = None
        if plan.policy == Agent.ContextPolicy.SUMMARIZE:
            summary = await context_summary(
                self.runtime, agent=self.turn.agent, rows=plan.rows, budget_tokens=plan.window // 2
            )
        await self._durably(
            "set rows aside", partial(context_set_aside, turn=self.turn, plan=plan, summary=summary)
        )
        return Step.ADMIT

    async def _wider_alternate(self, need: int) -> bool:
        """Whether an alternate that may serve has a window of at least ``need`` tokens: the
        next call goes there (``need_tokens``) rather than trim for the primary's window."""
        if self.need_tokens or not routed(self.turn.agent):
            return False
        serving = await self.runtime.db(
            partial(serving_choose, peek=True),
            self.runtime.pacer,
            self.turn.agent,
            time.time() * 1000,
            need_tokens=need,
        )
        if serving is None or not serving.on_alternate:
            return False
        self.need_tokens = need
        return True
