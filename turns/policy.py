"""The error policy (architecture.md §5.7): a pure decision from a failure, the retry state and
``now``.

The caller reads the clock once and passes ``now_ms``; randomness comes in as ``jitter``
(a number in [0, 1)), so every branch is testable at its edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

from agentops.retrying import jittered
from calls.types import ProviderError

TERMINAL_TYPES = {
    "auth",
    "quota",
    "policy",
    "context_length",
    "invalid_request",
    "unknown",
    "aborted",
}
BASE_RETRYABLE = {"server", "overloaded", "network", "timeout"}
RETRYABLE_STATED = BASE_RETRYABLE | {"rate_limit"}


@dataclass(frozen=True)
class PolicySettings:
    deadline_retry_delay_ms: float = 1000
    base_delays_ms: tuple[float, ...] = (1000, 2000, 4000)
    pacing_floor_ms: float = 60_000
    pacing_cap_ms: float = 600_000
    retry_episode_ms: float = 20 * 60_000


@dataclass(frozen=True)
class RetryState:
    consecutive_cuts: int = 0
    base_retries: int = 0
    episode_started_ms: float | None = None


class Action(StrEnum):
    RETRY = "retry"
    FAIL = "fail"
    EXHAUST = "exhaust"
    # A retryable failure that stated a wait: provider waits decide (architecture.md §6.6). The turn
    # is held (residents, conversations) or sleeps it (ephemeral runs); no failure is counted.
    HOLD = "hold"


@dataclass(frozen=True)
class Decision:
    action: Action
    delay_ms: float = 0.0
    # The failing call was itself a fresh call for an earlier cut, and was cut too.
    timed_out_again: bool = False
    reason: str = ""


def after_completed_call() -> RetryState:
    """A completed call resets every count and the retry episode."""
    return RetryState()


def decide(
    error: ProviderError,
    state: RetryState,
    *,
    now_ms: float,
    settings: PolicySettings,
    jitter: float,
) -> tuple[Decision, RetryState]:
    """What to do after a failed call, and the retry state that follows it."""
    if error.scope != "agent" and (
        error.type == "quota" or (error.retryable and error.retry_after_ms is not None)
    ):
        # A limit on the provider's model or account (architecture.md §6.12): held, never
        # failed, for as long as it binds (a spent credit: until released).
        return Decision(
            Action.HOLD,
            delay_ms=error.retry_after_ms if error.retry_after_ms is not None else math.inf,
            reason="the provider's limit binds its model or account",
        ), state
    if error.type in TERMINAL_TYPES:
        return Decision(Action.FAIL, reason="terminal"), replace(state, consecutive_cuts=0)

    episode = state.episode_started_ms if state.episode_started_ms is not None else now_ms
    if now_ms - episode >= settings.retry_episode_ms:
        return Decision(Action.EXHAUST, reason="the 20-minute retry episode is spent"), state
    if error.type == "timeout" and error.bound is not None:
        return _after_cut(state, episode=episode, settings=settings)
    state = replace(state, consecutive_cuts=0, episode_started_ms=episode)
    return _after_refusal(error, state, settings=settings, jitter=jitter)


def _after_cut(
    state: RetryState, *, episode: float, settings: PolicySettings
) -> tuple[Decision, RetryState]:
    """A deadline expiry: its own schedule, one fresh call, counted by consecutive expiries."""
    cuts = state.consecutive_cuts + 1
    following = replace(state, consecutive_cuts=cuts, episode_started_ms=episode)
    if cuts >= 2:
        return Decision(Action.FAIL, timed_out_again=True, reason="cut again"), following
    return Decision(Action.RETRY, delay_ms=settings.deadline_retry_delay_ms), following


def _after_refusal(
    error: ProviderError, state: RetryState, *, settings: PolicySettings, jitter: float
) -> tuple[Decision, RetryState]:
    """Any other failure within the episode: the provider's stated wait, the service's own
    pacing for a rate limit without one, the base schedule, or failed."""
    if error.retry_after_ms is not None and error.type in RETRYABLE_STATED:
        # The stated wait is a lower bound on the next call, never capped here.
        return Decision(
            Action.HOLD, delay_ms=error.retry_after_ms, reason="the provider stated a wait"
        ), state
    if error.type == "rate_limit":
        # The service's own pacing: the provider said to slow down but not for how long.
        delay = min(jittered(settings.pacing_floor_ms, jitter), settings.pacing_cap_ms)
        return Decision(Action.RETRY, delay_ms=delay), state
    if error.type in BASE_RETRYABLE:
        if state.base_retries >= len(settings.base_delays_ms):
            return Decision(Action.EXHAUST, reason="retries spent"), state
        base = settings.base_delays_ms[state.base_retries]
        return (
            Decision(Action.RETRY, delay_ms=jittered(base, jitter)),
            replace(state, base_retries=state.base_retries + 1),
        )
    return Decision(Action.FAIL, reason="not retryable"), state
