"""The progress bounds: a pure function from a call's state to its next deadline
(architecture.md §5.3).

All instants are milliseconds on one clock; ``now`` is never read here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from agentops.conf import ABSOLUTE_MS_DEFAULT


class Bound(StrEnum):
    BEFORE_CONTENT = "before_content"
    BETWEEN_EVENTS = "between_events"
    FLAT = "flat"
    ABSOLUTE = "absolute"
    WHOLE_CALL = "whole_call"


# The bounds whose deadline no model event moves: every call has exactly one of them.
FIXED_BOUNDS = frozenset({Bound.ABSOLUTE, Bound.WHOLE_CALL})

# The setting that raises each bound, named in a cut's message (architecture.md §5.5).
BOUND_SETTING = {
    Bound.BEFORE_CONTENT: "AGENTOPS_INFERENCE_BOUNDS.progress_bounds.before_content_ms",
    Bound.BETWEEN_EVENTS: "AGENTOPS_INFERENCE_BOUNDS.progress_bounds.between_events_ms",
    Bound.FLAT: "AGENTOPS_INFERENCE_BOUNDS.flat_minimum_ms",
    Bound.ABSOLUTE: "AGENTOPS_INFERENCE_BOUNDS.absolute_ms",
    Bound.WHOLE_CALL: "AGENTOPS_INFERENCE_BOUNDS.flat_minimum_ms",
}


@dataclass(frozen=True)
class BoundsSettings:
    before_content_ms: float = 60_000
    between_events_ms: float = 150_000
    think_tokens_per_second: float = 87
    flat_minimum_ms: float = 1_862_000
    absolute_ms: float = ABSOLUTE_MS_DEFAULT

    @property
    def setup_ms(self) -> float:
        return max(self.before_content_ms, self.between_events_ms)

    def allowance_ms(self, max_tokens: int | None) -> float:
        if not max_tokens:
            return 0.0
        return max_tokens / self.think_tokens_per_second * 1000


@dataclass(frozen=True)
class ShorterBeforeContent(BoundsSettings):
    """The bounds of one call whose caller set a shorter before-content bound (a return to the
    primary: architecture.md §6.11), and the setting a cut by it names."""

    before_content_setting: str = ""


@dataclass(frozen=True)
class CallState:
    """What the reader has seen of one call, as instants in ms (None: not yet)."""

    sent: float
    streamed: bool
    max_tokens: int | None = None
    thinking_start: float | None = None
    first_content: float | None = None
    last_model_event: float | None = None
    # True when the newest model event was a thinking block's start.
    last_event_was_thinking_start: bool = False
    # A non-streamed call's header section: when its first byte came, and when it was whole.
    header_begun: float | None = None
    headers: float | None = None


@dataclass(frozen=True)
class Deadline:
    at: float
    bound: Bound


def bound_deadlines(state: CallState, settings: BoundsSettings) -> list[Deadline]:
    """Every bound's deadline for ``state``, in the order architecture.md §5.3 lists the bounds: for
    a streamed call its progress bound (before content, or between events after it), the flat
    and the absolute bound; for a non-streamed call the whole-call bound, and the before-content
    bound from the first byte of its header section until the section is whole."""
    allowance = settings.allowance_ms(state.max_tokens)
    if not state.streamed:
        at = state.sent + (
            settings.setup_ms + allowance
            if state.max_tokens
            else max(settings.setup_ms, settings.flat_minimum_ms)
        )
        whole = Deadline(at, Bound.WHOLE_CALL)
        if state.header_begun is not None and state.headers is None:
            # A header section that began is whole within the before-content bound: a server
            # holds its headers back while it computes (that is the whole-call bound's), but
            # one that trickles them is not answering.
            begun = Deadline(state.header_begun + settings.before_content_ms, Bound.BEFORE_CONTENT)
            return [begun, whole]
        return [whole]
    out: list[Deadline] = []
    if state.first_content is None:
        at = state.sent + settings.before_content_ms
        if state.thinking_start is not None:
            at = max(at, state.thinking_start + allowance)
        out.append(Deadline(at, Bound.BEFORE_CONTENT))
    else:
        last = state.last_model_event if state.last_model_event is not None else state.first_content
        at = last + settings.between_events_ms
        if state.last_event_was_thinking_start and state.thinking_start is not None:
            at = max(at, state.thinking_start + allowance)
        out.append(Deadline(at, Bound.BETWEEN_EVENTS))
    anchor = state.last_model_event if state.last_model_event is not None else state.sent
    out.append(
        Deadline(anchor + max(settings.setup_ms + allowance, settings.flat_minimum_ms), Bound.FLAT)
    )
    out.append(Deadline(state.sent + settings.absolute_ms, Bound.ABSOLUTE))
    return out


def next_deadline(state: CallState, settings: BoundsSettings | None) -> Deadline | None:
    """The earliest deadline that applies to ``state``, or None when bounds are off.

    Ties go to the bound listed first in architecture.md §5.3 (``min`` keeps the first of equals,
    and ``bound_deadlines`` lists them in that order)."""
    if settings is None:
        return None
    return min(bound_deadlines(state, settings), key=_at)


def _at(deadline: Deadline) -> float:
    return deadline.at


def bound_setting(bound: Bound, state: CallState, settings: BoundsSettings) -> str:
    """The setting that, raised, moves this bound's deadline later (named in a cut)."""
    if bound is Bound.BEFORE_CONTENT and isinstance(settings, ShorterBeforeContent):
        return settings.before_content_setting
    if bound is not Bound.WHOLE_CALL:
        return BOUND_SETTING[bound]
    setup_field = (
        "progress_bounds.between_events_ms"
        if settings.between_events_ms >= settings.before_content_ms
        else "progress_bounds.before_content_ms"
    )
    if not state.max_tokens and settings.flat_minimum_ms > settings.setup_ms:
        return BOUND_SETTING[Bound.WHOLE_CALL]
    return f"AGENTOPS_INFERENCE_BOUNDS.{setup_field}"


def describe_cut(
    bound: Bound, state: CallState, deadline: Deadline, settings: BoundsSettings
) -> str:
    """The cut's message: which bound ran out, after how long, and the setting that raises it."""
    if bound is Bound.BEFORE_CONTENT and not state.streamed and state.header_begun is not None:
        span = deadline.at - state.header_begun
        what = f"the answer's header section was not whole {span:.0f} ms after it began"
    elif bound is Bound.BEFORE_CONTENT:
        span = deadline.at - state.sent
        what = f"no content for {span:.0f} ms after the request was sent"
    elif bound is Bound.BETWEEN_EVENTS:
        last = state.last_model_event if state.last_model_event is not None else state.sent
        what = f"no model event for {deadline.at - last:.0f} ms after content"
    elif bound is Bound.FLAT:
        anchor = state.last_model_event if state.last_model_event is not None else state.sent
        what = f"no model event for {deadline.at - anchor:.0f} ms"
    elif bound is Bound.ABSOLUTE:
        what = f"the call ran for {deadline.at - state.sent:.0f} ms"
    else:
        what = f"no complete response for {deadline.at - state.sent:.0f} ms"
    label = bound.value.replace("_", "-")
    return (
        f"{what} ({label} bound; "
        f"the setting for this bound: {bound_setting(bound, state, settings)})"
    )
