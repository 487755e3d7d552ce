"""The error policy as a pure decision (architecture.md §5.7): explicit ``now_ms`` and
``jitter``."""

from __future__ import annotations

import math

import pytest

from calls.types import ProviderError
from turns.policy import (
    Action,
    Decision,
    PolicySettings,
    RetryState,
    after_completed_call,
    decide,
)

T0 = 1_700_000_000_000.0
EPISODE = 20 * 60_000.0
SETTINGS = PolicySettings()


def cut(bound: str = "between_events") -> ProviderError:
    return ProviderError(type="timeout", message=f"no model event ({bound} bound)", bound=bound)


def failure(kind: str, status: int | None = None, wait: float | None = None) -> ProviderError:
    return ProviderError(
        type=kind, message=f"{kind} failure", http_status=status, retry_after_ms=wait
    )


def run(
    errors: list[ProviderError],
    *,
    state: RetryState | None = None,
    now: float = T0,
    step_ms: float = 0.0,
    jitter: float = 0.0,
    settings: PolicySettings = SETTINGS,
) -> tuple[list[Decision], RetryState]:
    """Feed failures one after another (``step_ms`` apart); return each decision and the end
    state."""
    state = state if state is not None else RetryState()
    decisions = []
    for i, error in enumerate(errors):
        decision, state = decide(
            error, state, now_ms=now + i * step_ms, settings=settings, jitter=jitter
        )
        decisions.append(decision)
    return decisions, state


def test_the_defaults_are_the_ones_in_the_design() -> None:
    assert SETTINGS == PolicySettings(
        deadline_retry_delay_ms=1_000,
        base_delays_ms=(1_000, 2_000, 4_000),
        pacing_floor_ms=60_000,
        pacing_cap_ms=600_000,
        retry_episode_ms=EPISODE,
    )


# -- deadline expiries -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bound", ["before_content", "between_events", "flat", "absolute", "whole_call"]
)
@pytest.mark.parametrize("jitter", [0.0, 0.999])
def test_a_cut_gets_one_fresh_call_after_the_deadline_retry_delay(
    bound: str, jitter: float
) -> None:
    decision, state = decide(cut(bound), RetryState(), now_ms=T0, settings=SETTINGS, jitter=jitter)
    assert decision == Decision(Action.RETRY, delay_ms=1_000)
    assert state == RetryState(consecutive_cuts=1, base_retries=0, episode_started_ms=T0)


def test_the_deadline_retry_delay_is_a_setting() -> None:
    settings = PolicySettings(deadline_retry_delay_ms=250)
    decision, _ = decide(cut(), RetryState(), now_ms=T0, settings=settings, jitter=0.5)
    assert decision == Decision(Action.RETRY, delay_ms=250)


def test_a_second_consecutive_cut_fails_the_turn_as_timed_out_again() -> None:
    decisions, state = run([cut(), cut()], step_ms=200_000)
    assert decisions[0] == Decision(Action.RETRY, delay_ms=1_000)
    assert decisions[1].action is Action.FAIL
    assert decisions[1].timed_out_again is True
    assert decisions[0].timed_out_again is False
    assert state.consecutive_cuts == 2


@pytest.mark.parametrize(
    "between",
    [
        failure("server", 503),
        failure("overloaded", 529),
        failure("network"),
        failure("timeout", 408),
        failure("rate_limit", 429),
    ],
    ids=lambda e: e.type,
)
def test_another_failure_between_two_cuts_resets_the_count_so_the_next_cut_retries_again(
    between: ProviderError,
) -> None:
    decisions, state = run([cut(), between, cut()], step_ms=1_000)
    assert [d.action for d in decisions] == [Action.RETRY, Action.RETRY, Action.RETRY]
    assert decisions[2] == Decision(Action.RETRY, delay_ms=1_000)
    assert state.consecutive_cuts == 1
    # ... and the cut after that one fails again.
    decision, _ = decide(cut(), state, now_ms=T0 + 3_000, settings=SETTINGS, jitter=0.0)
    assert (decision.action, decision.timed_out_again) == (Action.FAIL, True)


def test_a_terminal_failure_resets_the_count_of_cuts() -> None:
    decisions, state = run([cut(), failure("auth", 401)])
    assert decisions[1].action is Action.FAIL
    assert state.consecutive_cuts == 0


def test_a_completed_call_resets_every_count_and_the_episode() -> None:
    _, state = run([cut(), failure("server", 500), failure("server", 500)])
    assert state != RetryState()
    assert after_completed_call() == RetryState()
    decision, _ = decide(
        cut(), after_completed_call(), now_ms=T0 + 10_000, settings=SETTINGS, jitter=0
    )
    assert decision == Decision(Action.RETRY, delay_ms=1_000)


def test_a_408_is_retried_on_the_base_schedule_not_the_cut_schedule() -> None:
    decisions, state = run([failure("timeout", 408)] * 4, jitter=0.0)
    assert [(d.action, d.delay_ms) for d in decisions] == [
        (Action.RETRY, 1_000),
        (Action.RETRY, 2_000),
        (Action.RETRY, 4_000),
        (Action.EXHAUST, 0.0),
    ]
    assert not any(d.timed_out_again for d in decisions)
    assert state.consecutive_cuts == 0


# -- the base schedule -------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["server", "overloaded", "network", "timeout"])
@pytest.mark.parametrize(
    ("jitter", "delays"),
    [
        (0.0, [1_000.0, 2_000.0, 4_000.0]),
        (0.5, [1_250.0, 2_500.0, 5_000.0]),
        (0.999, [1_000 * 1.4995, 2_000 * 1.4995, 4_000 * 1.4995]),
    ],
)
def test_retryable_failures_retry_at_1_2_4_seconds_plus_up_to_half_again_then_exhaust(
    kind: str, jitter: float, delays: list[float]
) -> None:
    decisions, state = run([failure(kind)] * 4, step_ms=5_000, jitter=jitter)
    assert [d.action for d in decisions] == [
        Action.RETRY,
        Action.RETRY,
        Action.RETRY,
        Action.EXHAUST,
    ]
    assert [d.delay_ms for d in decisions[:3]] == pytest.approx(delays, abs=1e-9)
    assert state.base_retries == 3
    assert state.episode_started_ms == T0


def test_a_jitter_just_below_one_stays_below_half_again() -> None:
    decision, _ = decide(
        failure("server", 500), RetryState(), now_ms=T0, settings=SETTINGS, jitter=0.999
    )
    assert 1_000 <= decision.delay_ms < 1_500


# -- 429 pacing --------------------------------------------------------------------------------


@pytest.mark.parametrize(("jitter", "delay"), [(0.0, 60_000.0), (0.5, 75_000.0), (0.999, 89_970.0)])
def test_a_429_with_no_stated_wait_is_paced_from_the_floor_plus_up_to_half_again(
    jitter: float, delay: float
) -> None:
    decision, state = decide(
        failure("rate_limit", 429), RetryState(), now_ms=T0, settings=SETTINGS, jitter=jitter
    )
    assert decision.action is Action.RETRY
    assert decision.delay_ms == pytest.approx(delay, abs=1e-9)
    assert state == RetryState(consecutive_cuts=0, base_retries=0, episode_started_ms=T0)


@pytest.mark.parametrize(
    ("floor", "jitter", "delay"),
    [
        (500_000.0, 0.0, 500_000.0),
        (500_000.0, 0.2, 550_000.0),
        (500_000.0, 0.4, 600_000.0),
        (500_000.0, 0.999, 600_000.0),
        (600_000.0, 0.0, 600_000.0),
        (900_000.0, 0.0, 600_000.0),
    ],
)
def test_the_pacing_is_capped_at_ten_minutes(floor: float, jitter: float, delay: float) -> None:
    settings = PolicySettings(pacing_floor_ms=floor)
    decision, _ = decide(
        failure("rate_limit", 429), RetryState(), now_ms=T0, settings=settings, jitter=jitter
    )
    assert decision.action is Action.RETRY
    assert decision.delay_ms == pytest.approx(delay, abs=1e-6)


@pytest.mark.parametrize("stated", [0.0, 30_000.0, 60_001.0, 600_000.0, 900_000.0, 7_200_000.0])
@pytest.mark.parametrize("kind", [("rate_limit", 429), ("server", 503), ("overloaded", 529)])
def test_a_retryable_failure_that_states_a_wait_is_held_for_exactly_that_wait(
    stated: float, kind: tuple[str, int]
) -> None:
    decision, _ = decide(
        failure(kind[0], kind[1], wait=stated),
        RetryState(),
        now_ms=T0,
        settings=SETTINGS,
        jitter=0.999,
    )
    assert decision.action is Action.HOLD
    assert decision.delay_ms == stated  # a lower bound, not capped, no jitter


@pytest.mark.parametrize("stated", [float("nan"), float("inf"), float("-inf")])
def test_a_429_that_states_a_non_finite_wait_is_held_until_released(stated: float) -> None:
    decision, _ = decide(
        failure("rate_limit", 429, wait=stated),
        RetryState(),
        now_ms=T0,
        settings=SETTINGS,
        jitter=0,
    )
    assert decision.action is Action.HOLD
    assert decision.delay_ms != decision.delay_ms or abs(decision.delay_ms) == float("inf")


def test_repeated_429s_are_limited_by_the_episode_not_by_a_count() -> None:
    decisions, _ = run([failure("rate_limit", 429)] * 12, step_ms=90_000)
    assert [d.action for d in decisions] == [Action.RETRY] * 12
    decision, _ = decide(
        failure("rate_limit", 429),
        RetryState(episode_started_ms=T0),
        now_ms=T0 + EPISODE,
        settings=SETTINGS,
        jitter=0,
    )
    assert decision.action is Action.EXHAUST


@pytest.mark.parametrize(
    "error",
    [
        failure("rate_limit", 429, wait=900_000.0),
        failure("rate_limit", 429, wait=7_200_000.0),
        failure("server", 503, wait=30_000.0),
        failure("overloaded", 529, wait=5_000.0),
    ],
    ids=["429-15-min", "429-2-h", "503-30-s", "529-5-s"],
)
def test_no_retry_is_made_before_a_stated_wait_is_over(error: ProviderError) -> None:
    decision, _ = decide(error, RetryState(), now_ms=T0, settings=SETTINGS, jitter=0.0)
    assert error.retry_after_ms is not None
    assert not (decision.action is Action.RETRY and decision.delay_ms < error.retry_after_ms)


# -- terminal failures -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        failure("auth", 401),
        failure("auth", 403),
        failure("quota", 429),
        failure("quota", 429, wait=1_000.0),
        failure("policy", 400),
        failure("context_length", 413),
        failure("context_length", 400),
        failure("invalid_request", 400),
        failure("invalid_request", 404),
        failure("unknown", 418),
        failure("aborted"),
    ],
    ids=lambda e: f"{e.type}-{e.http_status}",
)
@pytest.mark.parametrize(
    "state",
    [
        RetryState(),
        RetryState(consecutive_cuts=1, base_retries=2, episode_started_ms=T0 - 60_000),
        RetryState(episode_started_ms=T0 - 2 * EPISODE),
    ],
    ids=["fresh", "mid-episode", "episode-spent"],
)
def test_a_terminal_failure_fails_at_once(error: ProviderError, state: RetryState) -> None:
    decision, following = decide(error, state, now_ms=T0, settings=SETTINGS, jitter=0.0)
    assert decision.action is Action.FAIL
    assert decision.delay_ms == 0
    assert decision.timed_out_again is False
    assert following.consecutive_cuts == 0
    assert following.episode_started_ms == state.episode_started_ms


# -- the 20-minute retry episode ---------------------------------------------------------------


def test_the_episode_starts_at_the_first_recoverable_failure_and_is_shared() -> None:
    errors = [failure("server", 500), cut(), failure("rate_limit", 429), failure("network"), cut()]
    state = RetryState()
    for i, error in enumerate(errors):
        _, state = decide(error, state, now_ms=T0 + i * 10_000, settings=SETTINGS, jitter=0.0)
        assert state.episode_started_ms == T0


def test_a_terminal_failure_does_not_start_the_episode() -> None:
    _, state = decide(failure("auth", 401), RetryState(), now_ms=T0, settings=SETTINGS, jitter=0.0)
    assert state.episode_started_ms is None


@pytest.mark.parametrize(
    "error",
    [
        cut(),
        failure("server", 500),
        failure("overloaded", 529),
        failure("network"),
        failure("timeout", 408),
        failure("rate_limit", 429),
    ],
    ids=["cut", "server", "overloaded", "network", "408", "rate_limit"],
)
@pytest.mark.parametrize(
    ("offset", "action"),
    [(-1.0, Action.RETRY), (0.0, Action.EXHAUST), (1.0, Action.EXHAUST)],
    ids=["1-ms-before", "exactly-20-min", "1-ms-after"],
)
def test_the_episode_is_spent_at_exactly_twenty_minutes(
    error: ProviderError, offset: float, action: Action
) -> None:
    state = RetryState(episode_started_ms=T0)
    decision, following = decide(
        error, state, now_ms=T0 + EPISODE + offset, settings=SETTINGS, jitter=0.0
    )
    assert decision.action is action
    assert following.episode_started_ms == T0
    if action is Action.EXHAUST:
        assert following == state


def test_the_episode_length_is_a_setting() -> None:
    settings = PolicySettings(retry_episode_ms=5_000)
    state = RetryState(episode_started_ms=T0)
    before, _ = decide(
        failure("server", 500), state, now_ms=T0 + 4_999, settings=settings, jitter=0.0
    )
    at, _ = decide(failure("server", 500), state, now_ms=T0 + 5_000, settings=settings, jitter=0.0)
    assert (before.action, at.action) == (Action.RETRY, Action.EXHAUST)


# -- every branch's whole decision, reason included ----------------------------------------------
# The reason says which branch decided; each branch is pinned whole, so a reason cannot drift
# to another branch's words or go missing unnoticed.


@pytest.mark.parametrize(
    ("error", "state", "now", "decision"),
    [
        pytest.param(
            failure("auth", 401),
            RetryState(),
            T0,
            Decision(Action.FAIL, reason="terminal"),
            id="terminal",
        ),
        pytest.param(
            failure("server", 500),
            RetryState(episode_started_ms=T0),
            T0 + EPISODE,
            Decision(Action.EXHAUST, reason="the 20-minute retry episode is spent"),
            id="episode-spent",
        ),
        pytest.param(
            cut(),
            RetryState(consecutive_cuts=1, episode_started_ms=T0),
            T0,
            Decision(Action.FAIL, timed_out_again=True, reason="cut again"),
            id="cut-again",
        ),
        pytest.param(
            cut(), RetryState(), T0, Decision(Action.RETRY, delay_ms=1_000), id="first-cut"
        ),
        pytest.param(
            failure("rate_limit", 429, wait=5_000.0),
            RetryState(),
            T0,
            Decision(Action.HOLD, delay_ms=5_000.0, reason="the provider stated a wait"),
            id="stated-wait",
        ),
        pytest.param(
            failure("rate_limit", 429),
            RetryState(),
            T0,
            Decision(Action.RETRY, delay_ms=60_000),
            id="pacing",
        ),
        pytest.param(
            failure("server", 500),
            RetryState(base_retries=3),
            T0,
            Decision(Action.EXHAUST, reason="retries spent"),
            id="retries-spent",
        ),
        pytest.param(
            failure("server", 500),
            RetryState(),
            T0,
            Decision(Action.RETRY, delay_ms=1_000),
            id="base-retry",
        ),
        pytest.param(
            failure("something_new", 599),
            RetryState(),
            T0,
            Decision(Action.FAIL, reason="not retryable"),
            id="unrecognised-type",
        ),
    ],
)
def test_each_branch_decides_its_action_delay_and_reason(
    error: ProviderError, state: RetryState, now: float, decision: Decision
) -> None:
    assert decide(error, state, now_ms=now, settings=SETTINGS, jitter=0.0)[0] == decision


@pytest.mark.parametrize("kind", ["something_new", "", "rate-limit", "Server"])
def test_a_failure_of_a_type_the_policy_does_not_know_fails_without_retry(kind: str) -> None:
    """Neither terminal nor retryable: a type the policy was not taught fails; it is not retried."""
    decision, state = decide(
        failure(kind), RetryState(base_retries=1), now_ms=T0, settings=SETTINGS, jitter=0.0
    )
    assert decision == Decision(Action.FAIL, reason="not retryable")
    assert state == RetryState(base_retries=1, episode_started_ms=T0)


# -- a limit on the provider's model or account (architecture.md §6.12) --------------------------

SCOPED = "the provider's limit binds its model or account"


@pytest.mark.parametrize("scope", ["model", "account"])
def test_a_limit_beyond_the_agent_holds_for_its_stated_wait_or_until_released(scope: str) -> None:
    waited = ProviderError(
        type="rate_limit", message="m", retryable=True, retry_after_ms=2_000.0, scope=scope
    )
    assert decide(waited, RetryState(), now_ms=T0, settings=SETTINGS, jitter=0.9) == (
        Decision(Action.HOLD, delay_ms=2_000.0, reason=SCOPED),
        RetryState(),  # held, not a retry: the episode does not start
    )
    spent = ProviderError(type="quota", message="credit", retryable=False, scope=scope)
    assert decide(spent, RetryState(), now_ms=T0, settings=SETTINGS, jitter=0.0)[0] == Decision(
        Action.HOLD, delay_ms=math.inf, reason=SCOPED
    )


@pytest.mark.parametrize(
    "error",
    [
        # Retryable with no stated wait: paced as the agent's own 429, not held for ever.
        ProviderError(type="rate_limit", message="m", retryable=True, scope="model"),
        # A stated wait on a failure not to be retried: its type decides, not the scope.
        ProviderError(
            type="invalid_request", message="m", retryable=False, retry_after_ms=5.0, scope="model"
        ),
        # The agent's own quota: failed as before.
        ProviderError(type="quota", message="m", retryable=False),
    ],
)
def test_only_a_model_or_account_limit_with_a_wait_or_a_spent_credit_is_held_so(
    error: ProviderError,
) -> None:
    decision, _ = decide(error, RetryState(), now_ms=T0, settings=SETTINGS, jitter=0.0)
    assert decision.reason != SCOPED
