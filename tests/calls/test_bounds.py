"""The progress bounds as a pure function of a call's state (architecture.md §5.3, §5.5).

Every instant is an explicit number of ms; ``next_deadline`` never reads a clock. The caller's
cut rule is ``now >= deadline.at``, so each bound is shown at deadline - 1 ms (not cut), at the
deadline (cut) and at deadline + 1 ms (cut).
"""

from __future__ import annotations

import dataclasses

import pytest

from calls.bounds import (
    BOUND_SETTING,
    Bound,
    BoundsSettings,
    CallState,
    Deadline,
    bound_deadlines,
    bound_setting,
    describe_cut,
    next_deadline,
)
from calls.client import Timeline

S = 1_000_000.0  # the instant the request was sent
DEFAULTS = BoundsSettings()
BEFORE = 60_000.0
BETWEEN = 150_000.0
SETUP = 150_000.0
FLAT_MINIMUM = 1_862_000.0
ABSOLUTE = 75 * 60_000.0

# max_tokens chosen so that max_tokens / 87 tokens per second is a whole number of seconds.
TOKENS_1_S = 87  # allowance 1,000 ms
TOKENS_100_S = 87 * 100  # allowance 100,000 ms: longer than before-content, shorter than between
TOKENS_200_S = 87 * 200  # allowance 200,000 ms: longer than both phase bounds
TOKENS_1800_S = 87 * 1800  # allowance 1,800,000 ms: setup + allowance > flat minimum


def is_cut(now: float, deadline: Deadline) -> bool:
    """The rule a caller applies to the returned deadline."""
    return now >= deadline.at


def streamed(**fields: float | int | bool | None) -> CallState:
    return CallState(sent=S, streamed=True, **fields)  # type: ignore[arg-type]


def test_the_defaults_are_the_ones_in_the_design() -> None:
    assert DEFAULTS.before_content_ms == BEFORE
    assert DEFAULTS.between_events_ms == BETWEEN
    assert DEFAULTS.think_tokens_per_second == 87
    assert DEFAULTS.flat_minimum_ms == FLAT_MINIMUM
    assert DEFAULTS.absolute_ms == ABSOLUTE
    assert DEFAULTS.setup_ms == SETUP


@pytest.mark.parametrize(
    ("max_tokens", "allowance"),
    [
        (None, 0.0),
        (0, 0.0),
        (TOKENS_1_S, 1_000.0),
        (TOKENS_100_S, 100_000.0),
        (TOKENS_200_S, 200_000.0),
        (TOKENS_1800_S, 1_800_000.0),
    ],
)
def test_the_thinking_allowance_is_max_tokens_over_think_tokens_per_second(
    max_tokens: int | None, allowance: float
) -> None:
    assert DEFAULTS.allowance_ms(max_tokens) == allowance


def test_setup_is_the_larger_phase_bound() -> None:
    assert BoundsSettings(before_content_ms=200_000, between_events_ms=1_000).setup_ms == 200_000
    assert BoundsSettings(before_content_ms=1_000, between_events_ms=200_000).setup_ms == 200_000


# Each bound at its edges: (case, state, settings, expected deadline).
# The flat bound can only come first in a state where content is recorded but no model event
# is (see test_the_flat_bound_never_passes_before_the_phase_bound_of_a_consistent_stream), so
# its rows use that state to isolate it.
EDGE_CASES = [
    pytest.param(
        streamed(),
        DEFAULTS,
        Deadline(S + BEFORE, Bound.BEFORE_CONTENT),
        id="before_content-nothing-but-keepalives",
    ),
    pytest.param(
        streamed(max_tokens=TOKENS_200_S),
        DEFAULTS,
        Deadline(S + BEFORE, Bound.BEFORE_CONTENT),
        id="before_content-allowance-ignored-until-thinking-starts",
    ),
    pytest.param(
        streamed(first_content=S + 5_000, last_model_event=S + 20_000),
        DEFAULTS,
        Deadline(S + 20_000 + BETWEEN, Bound.BETWEEN_EVENTS),
        id="between_events-after-the-last-model-event",
    ),
    pytest.param(
        streamed(first_content=S + 5_000),
        DEFAULTS,
        Deadline(S + 5_000 + BETWEEN, Bound.BETWEEN_EVENTS),
        id="between_events-anchored-at-first-content-without-a-last-event",
    ),
    pytest.param(
        streamed(first_content=S + 3_000_000),
        DEFAULTS,
        Deadline(S + FLAT_MINIMUM, Bound.FLAT),
        id="flat-anchored-at-sent-with-no-model-event",
    ),
    pytest.param(
        streamed(first_content=S + 3_000_000, max_tokens=TOKENS_1800_S),
        DEFAULTS,
        Deadline(S + SETUP + 1_800_000, Bound.FLAT),
        id="flat-setup-plus-allowance-above-the-flat-minimum",
    ),
    pytest.param(
        streamed(first_content=S + 1_000, last_model_event=S + ABSOLUTE - 10_000),
        DEFAULTS,
        Deadline(S + ABSOLUTE, Bound.ABSOLUTE),
        id="absolute-a-stream-that-keeps-sending-model-events",
    ),
    pytest.param(
        streamed(
            first_content=S + 1_000,
            last_model_event=S + ABSOLUTE - 10_000,
            thinking_start=S + ABSOLUTE - 10_000,
            last_event_was_thinking_start=True,
            max_tokens=TOKENS_1800_S,
        ),
        DEFAULTS,
        Deadline(S + ABSOLUTE, Bound.ABSOLUTE),
        id="absolute-never-moved-by-a-thinking-allowance",
    ),
    pytest.param(
        CallState(sent=S, streamed=False, max_tokens=TOKENS_100_S),
        DEFAULTS,
        Deadline(S + SETUP + 100_000, Bound.WHOLE_CALL),
        id="whole_call-setup-plus-allowance",
    ),
    pytest.param(
        CallState(sent=S, streamed=False),
        DEFAULTS,
        Deadline(S + FLAT_MINIMUM, Bound.WHOLE_CALL),
        id="whole_call-no-max_tokens-flat-minimum-above-setup",
    ),
    pytest.param(
        CallState(sent=S, streamed=False),
        BoundsSettings(flat_minimum_ms=1_000),
        Deadline(S + SETUP, Bound.WHOLE_CALL),
        id="whole_call-no-max_tokens-setup-above-flat-minimum",
    ),
]


@pytest.mark.parametrize(("state", "settings", "expected"), EDGE_CASES)
@pytest.mark.parametrize(("offset", "cut"), [(-1.0, False), (0.0, True), (1.0, True)])
def test_each_bound_cuts_at_its_deadline_and_not_one_ms_before(
    state: CallState, settings: BoundsSettings, expected: Deadline, offset: float, cut: bool
) -> None:
    deadline = next_deadline(state, settings)
    assert deadline is not None
    assert deadline.at == expected.at
    assert deadline.bound is expected.bound
    assert is_cut(expected.at + offset, deadline) is cut


# Thinking allowance against the phase bounds: (state, expected deadline).
THINKING_CASES = [
    pytest.param(
        streamed(thinking_start=S + 1_000, last_model_event=S + 1_000, max_tokens=TOKENS_100_S),
        Deadline(S + 1_000 + 100_000, Bound.BEFORE_CONTENT),
        id="before_content-allowance-longer-wins",
    ),
    pytest.param(
        streamed(thinking_start=S + 1_000, last_model_event=S + 1_000, max_tokens=TOKENS_1_S),
        Deadline(S + BEFORE, Bound.BEFORE_CONTENT),
        id="before_content-allowance-shorter-keeps-sent-plus-bound",
    ),
    pytest.param(
        streamed(thinking_start=S + 59_000, last_model_event=S + 59_000, max_tokens=TOKENS_1_S),
        Deadline(S + 60_000, Bound.BEFORE_CONTENT),
        id="before_content-tie-of-the-two-terms",
    ),
    pytest.param(
        streamed(thinking_start=S + 1_000, last_model_event=S + 50_000, max_tokens=TOKENS_100_S),
        Deadline(S + 1_000 + 100_000, Bound.BEFORE_CONTENT),
        id="before_content-thinking-deltas-do-not-move-it",
    ),
    pytest.param(
        streamed(
            first_content=S + 10_000,
            thinking_start=S + 50_000,
            last_model_event=S + 50_000,
            last_event_was_thinking_start=True,
            max_tokens=TOKENS_200_S,
        ),
        Deadline(S + 50_000 + 200_000, Bound.BETWEEN_EVENTS),
        id="between_events-thinking-start-last-allowance-longer-wins",
    ),
    pytest.param(
        streamed(
            first_content=S + 10_000,
            thinking_start=S + 50_000,
            last_model_event=S + 50_000,
            last_event_was_thinking_start=True,
            max_tokens=TOKENS_100_S,
        ),
        Deadline(S + 50_000 + BETWEEN, Bound.BETWEEN_EVENTS),
        id="between_events-thinking-start-last-allowance-shorter-keeps-bound",
    ),
    pytest.param(
        streamed(
            first_content=S + 10_000,
            thinking_start=S + 50_000,
            last_model_event=S + 60_000,
            last_event_was_thinking_start=False,
            max_tokens=TOKENS_200_S,
        ),
        Deadline(S + 60_000 + BETWEEN, Bound.BETWEEN_EVENTS),
        id="between_events-allowance-ignored-when-last-event-was-not-a-thinking-start",
    ),
]


@pytest.mark.parametrize(("state", "expected"), THINKING_CASES)
@pytest.mark.parametrize(("offset", "cut"), [(-1.0, False), (0.0, True), (1.0, True)])
def test_a_started_thinking_block_takes_the_later_of_the_phase_bound_and_its_allowance(
    state: CallState, expected: Deadline, offset: float, cut: bool
) -> None:
    deadline = next_deadline(state, DEFAULTS)
    assert deadline == expected
    assert is_cut(expected.at + offset, deadline) is cut


@pytest.mark.parametrize(
    "state",
    [
        streamed(),
        streamed(first_content=S + 1, last_model_event=S + 1),
        CallState(sent=S, streamed=False),
        CallState(sent=S, streamed=False, max_tokens=TOKENS_100_S),
    ],
)
def test_bounds_off_gives_no_deadline(state: CallState) -> None:
    assert next_deadline(state, None) is None


# Ties: each pair of bounds set to the same instant; the bound listed first in §5.3 wins.
TIE_CASES = [
    pytest.param(
        streamed(),
        BoundsSettings(before_content_ms=1_000, between_events_ms=500, flat_minimum_ms=1_000),
        Deadline(S + 1_000, Bound.BEFORE_CONTENT),
        id="before_content-over-flat",
    ),
    pytest.param(
        streamed(),
        BoundsSettings(absolute_ms=BEFORE),
        Deadline(S + BEFORE, Bound.BEFORE_CONTENT),
        id="before_content-over-absolute",
    ),
    pytest.param(
        streamed(first_content=S + 100, last_model_event=S + 100),
        BoundsSettings(before_content_ms=500, between_events_ms=1_000, flat_minimum_ms=1_000),
        Deadline(S + 1_100, Bound.BETWEEN_EVENTS),
        id="between_events-over-flat",
    ),
    pytest.param(
        streamed(first_content=S + 100, last_model_event=S + 100),
        BoundsSettings(absolute_ms=100 + BETWEEN),
        Deadline(S + 100 + BETWEEN, Bound.BETWEEN_EVENTS),
        id="between_events-over-absolute",
    ),
    pytest.param(
        streamed(first_content=S + 3_000_000),
        BoundsSettings(absolute_ms=FLAT_MINIMUM),
        Deadline(S + FLAT_MINIMUM, Bound.FLAT),
        id="flat-over-absolute",
    ),
]


def test_a_non_streamed_header_section_that_began_is_bounded_until_it_is_whole() -> None:
    waiting = CallState(sent=S, streamed=False, max_tokens=None)
    begun = CallState(sent=S, streamed=False, max_tokens=None, header_begun=S + 5_000)
    whole = CallState(
        sent=S, streamed=False, max_tokens=None, header_begun=S + 5_000, headers=S + 6_000
    )
    # Nothing yet: a server computing its answer is under the whole-call bound alone.
    assert next_deadline(waiting, DEFAULTS) == next_deadline(whole, DEFAULTS)
    assert next_deadline(waiting, DEFAULTS).bound is Bound.WHOLE_CALL  # type: ignore[union-attr]
    assert next_deadline(begun, DEFAULTS) == Deadline(S + 5_000 + BEFORE, Bound.BEFORE_CONTENT)


@pytest.mark.parametrize(("state", "settings", "expected"), TIE_CASES)
def test_a_tie_goes_to_the_bound_listed_first(
    state: CallState, settings: BoundsSettings, expected: Deadline
) -> None:
    assert next_deadline(state, settings) == expected


def test_a_keepalive_only_stream_is_cut_before_content() -> None:
    # Keepalives are counted on the timeline but have no field in CallState at all.
    assert {f.name for f in dataclasses.fields(CallState)} == {
        "sent",
        "streamed",
        "max_tokens",
        "thinking_start",
        "first_content",
        "last_model_event",
        "last_event_was_thinking_start",
        "header_begun",  # a non-streamed call's header section, not keepalives
        "headers",
    }
    quiet = Timeline(sent=S, headers=S + 5)
    busy = Timeline(sent=S, headers=S + 5, keepalives=10_000)
    assert busy.state(streamed=True, max_tokens=None) == quiet.state(streamed=True, max_tokens=None)
    assert next_deadline(busy.state(streamed=True, max_tokens=None), DEFAULTS) == Deadline(
        S + BEFORE, Bound.BEFORE_CONTENT
    )


def test_keepalives_after_content_do_not_move_the_between_events_deadline() -> None:
    timeline = Timeline(sent=S, first_content=S + 1_000, last_event=S + 2_000, model_events=2)
    before = next_deadline(timeline.state(streamed=True, max_tokens=None), DEFAULTS)
    timeline.keepalives += 500
    after = next_deadline(timeline.state(streamed=True, max_tokens=None), DEFAULTS)
    assert before == after == Deadline(S + 2_000 + BETWEEN, Bound.BETWEEN_EVENTS)


@pytest.mark.parametrize("gap", [1_000.0, 100_000.0, BETWEEN - 1])
def test_a_stream_that_keeps_sending_model_events_is_cut_only_by_the_absolute_bound(
    gap: float,
) -> None:
    last = S + 1_000
    while True:
        deadline = next_deadline(streamed(first_content=S + 1_000, last_model_event=last), DEFAULTS)
        assert deadline is not None
        if deadline.bound is not Bound.BETWEEN_EVENTS:
            break
        assert last + gap < deadline.at  # the next event comes before the deadline
        last += gap
    assert deadline == Deadline(S + ABSOLUTE, Bound.ABSOLUTE)


@pytest.mark.parametrize("max_tokens", [None, TOKENS_1_S, TOKENS_200_S, TOKENS_1800_S])
@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"thinking_start": S + 10, "last_model_event": S + 10},
        {"thinking_start": S + 10, "last_model_event": S + 40_000},
        {"first_content": S + 10, "last_model_event": S + 10},
        {
            "first_content": S + 10,
            "thinking_start": S + 50,
            "last_model_event": S + 50,
            "last_event_was_thinking_start": True,
        },
    ],
)
def test_the_flat_bound_never_passes_before_the_phase_bound_of_a_consistent_stream(
    max_tokens: int | None, fields: dict[str, float | bool]
) -> None:
    # In a state the reader builds (content is a model event, so first_content implies
    # last_model_event), the flat deadline is never earlier than the phase bound's.
    deadline = next_deadline(streamed(max_tokens=max_tokens, **fields), DEFAULTS)
    assert deadline is not None
    assert deadline.bound in (Bound.BEFORE_CONTENT, Bound.BETWEEN_EVENTS)


# describe_cut: (state, settings, expected message).
MESSAGES = [
    pytest.param(
        streamed(first_content=S + 5_000, last_model_event=S + 20_000),
        DEFAULTS,
        "no model event for 150000 ms after content (between-events bound; the setting for "
        "this bound: AGENTOPS_INFERENCE_BOUNDS.progress_bounds.between_events_ms)",
        id="between_events",
    ),
    pytest.param(
        streamed(),
        DEFAULTS,
        "no content for 60000 ms after the request was sent (before-content bound; the setting "
        "for this bound: AGENTOPS_INFERENCE_BOUNDS.progress_bounds.before_content_ms)",
        id="before_content",
    ),
    pytest.param(
        streamed(thinking_start=S + 1_000, last_model_event=S + 1_000, max_tokens=TOKENS_100_S),
        DEFAULTS,
        "no content for 101000 ms after the request was sent (before-content bound; the "
        "setting for this bound: AGENTOPS_INFERENCE_BOUNDS.progress_bounds.before_content_ms)",
        id="before_content-with-thinking-allowance",
    ),
    pytest.param(
        streamed(first_content=S + 3_000_000),
        DEFAULTS,
        "no model event for 1862000 ms (flat bound; the setting for this bound: "
        "AGENTOPS_INFERENCE_BOUNDS.flat_minimum_ms)",
        id="flat",
    ),
    pytest.param(
        streamed(first_content=S + 1_000, last_model_event=S + ABSOLUTE - 10_000),
        DEFAULTS,
        "the call ran for 4500000 ms (absolute bound; the setting for this bound: "
        "AGENTOPS_INFERENCE_BOUNDS.absolute_ms)",
        id="absolute",
    ),
    pytest.param(
        CallState(sent=S, streamed=False),
        DEFAULTS,
        "no complete response for 1862000 ms (whole-call bound; the setting for this bound: "
        "AGENTOPS_INFERENCE_BOUNDS.flat_minimum_ms)",
        id="whole_call",
    ),
]


@pytest.mark.parametrize(("state", "settings", "message"), MESSAGES)
def test_a_cut_message_names_the_bound_how_long_and_its_setting(
    state: CallState, settings: BoundsSettings, message: str
) -> None:
    deadline = next_deadline(state, settings)
    assert deadline is not None
    assert describe_cut(deadline.bound, state, deadline, settings) == message


def test_every_bound_names_a_setting_under_agentops_inference_bounds() -> None:
    assert set(BOUND_SETTING) == set(Bound)
    for path in BOUND_SETTING.values():
        assert path.startswith("AGENTOPS_INFERENCE_BOUNDS.")
        assert hasattr(DEFAULTS, path.rsplit(".", 1)[1])


# The setting a cut message names must be one that raises that bound (architecture.md §5.5).
RAISE_CASES = [
    pytest.param(streamed(), id="before_content"),
    pytest.param(streamed(first_content=S + 5_000, last_model_event=S + 20_000), id="between"),
    pytest.param(streamed(first_content=S + 3_000_000), id="flat"),
    pytest.param(
        streamed(first_content=S + 1_000, last_model_event=S + ABSOLUTE - 10_000), id="absolute"
    ),
    pytest.param(CallState(sent=S, streamed=False), id="whole_call-no-max_tokens"),
    pytest.param(
        CallState(sent=S, streamed=False, max_tokens=TOKENS_100_S), id="whole_call-with-max_tokens"
    ),
]


@pytest.mark.parametrize("state", RAISE_CASES)
def test_raising_the_setting_a_cut_names_moves_that_deadline_later(state: CallState) -> None:
    deadline = next_deadline(state, DEFAULTS)
    assert deadline is not None
    field = bound_setting(deadline.bound, state, DEFAULTS).rsplit(".", 1)[1]
    raised = dataclasses.replace(DEFAULTS, **{field: getattr(DEFAULTS, field) * 10})
    later = next_deadline(state, raised)
    assert later is not None
    assert later.at > deadline.at


# A whole call's deadline is sent + setup (+ allowance), or the flat minimum when it is larger and
# no max_tokens is set: its cut names whichever of those settings set it. Setup is the larger
# phase bound, between-events on a tie; on a tie of setup and the flat minimum, setup is named.
# Raising the named setting moves the deadline later in every case.
@pytest.mark.parametrize(
    ("before", "between", "flat", "max_tokens", "field"),
    [
        pytest.param(
            BEFORE,
            BETWEEN,
            FLAT_MINIMUM,
            TOKENS_100_S,
            "progress_bounds.between_events_ms",
            id="between-larger",
        ),
        pytest.param(
            200_000,
            BETWEEN,
            FLAT_MINIMUM,
            TOKENS_100_S,
            "progress_bounds.before_content_ms",
            id="before-larger",
        ),
        pytest.param(
            BETWEEN,
            BETWEEN,
            FLAT_MINIMUM,
            TOKENS_100_S,
            "progress_bounds.between_events_ms",
            id="phase-tie",
        ),
        pytest.param(
            200_000, BETWEEN, FLAT_MINIMUM, None, "flat_minimum_ms", id="no-max_tokens-flat-larger"
        ),
        pytest.param(
            200_000,
            BETWEEN,
            100_000,
            None,
            "progress_bounds.before_content_ms",
            id="no-max_tokens-setup-larger",
        ),
        pytest.param(
            BEFORE,
            BETWEEN,
            BETWEEN,
            None,
            "progress_bounds.between_events_ms",
            id="no-max_tokens-flat-tie",
        ),
    ],
)
def test_a_whole_call_cut_names_the_setting_that_set_its_deadline(
    before: float, between: float, flat: float, max_tokens: int | None, field: str
) -> None:
    settings = BoundsSettings(
        before_content_ms=before, between_events_ms=between, flat_minimum_ms=flat
    )
    state = CallState(sent=S, streamed=False, max_tokens=max_tokens)
    deadline = next_deadline(state, settings)
    assert deadline is not None and deadline.bound is Bound.WHOLE_CALL
    assert bound_setting(Bound.WHOLE_CALL, state, settings) == f"AGENTOPS_INFERENCE_BOUNDS.{field}"
    name = field.rsplit(".", 1)[-1]
    raised = next_deadline(
        state, dataclasses.replace(settings, **{name: getattr(settings, name) * 10})
    )
    assert raised is not None and raised.at > deadline.at


def test_a_flat_cut_counts_from_the_last_model_event() -> None:
    state = streamed(thinking_start=S + 1_000, last_model_event=S + 40_000, max_tokens=TOKENS_100_S)
    (flat,) = [d for d in bound_deadlines(state, DEFAULTS) if d.bound is Bound.FLAT]
    assert flat.at == S + 40_000 + FLAT_MINIMUM
    assert describe_cut(Bound.FLAT, state, flat, DEFAULTS).startswith(
        f"no model event for {FLAT_MINIMUM:.0f} ms (flat bound;"
    )


def test_a_header_section_that_never_ends_is_named_as_such_only_for_a_whole_answer() -> None:
    """A non-streamed answer whose header section began and never ended is cut by the
    before-content bound counted from when it began; a streamed one is still 'no content'."""
    began = S + 2_000
    deadline = Deadline(began + BEFORE, Bound.BEFORE_CONTENT)
    whole = CallState(sent=S, streamed=False, header_begun=began)
    assert describe_cut(Bound.BEFORE_CONTENT, whole, deadline, DEFAULTS) == (
        "the answer's header section was not whole 60000 ms after it began (before-content "
        "bound; the setting for this bound: AGENTOPS_INFERENCE_BOUNDS.progress_bounds."
        "before_content_ms)"
    )
    streamed_state = CallState(sent=S, streamed=True, header_begun=began)
    assert describe_cut(Bound.BEFORE_CONTENT, streamed_state, deadline, DEFAULTS).startswith(
        "no content for 62000 ms after the request was sent"
    )
    unbegun = CallState(sent=S, streamed=False)
    assert describe_cut(Bound.BEFORE_CONTENT, unbegun, deadline, DEFAULTS).startswith(
        "no content for 62000 ms after the request was sent"
    )
    # The between-events bound of the same call is not named by the header section.
    assert describe_cut(Bound.BETWEEN_EVENTS, whole, deadline, DEFAULTS).startswith(
        "no model event for 62000 ms after content"
    )


def test_a_shorter_before_content_bound_names_its_own_setting_and_no_other() -> None:
    from calls.bounds import ShorterBeforeContent

    shorter = ShorterBeforeContent(
        before_content_ms=10_000, before_content_setting="AGENTOPS_FALLBACK_RETURN_FIRST_CONTENT_MS"
    )
    state = CallState(sent=S, streamed=True)
    assert bound_setting(Bound.BEFORE_CONTENT, state, shorter) == (
        "AGENTOPS_FALLBACK_RETURN_FIRST_CONTENT_MS"
    )
    assert (
        bound_setting(Bound.BETWEEN_EVENTS, state, shorter) == BOUND_SETTING[Bound.BETWEEN_EVENTS]
    )
