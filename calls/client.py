"""What a provider call is and what came of it: its edge limits, its timeline and its result
(architecture.md §5.2, §5.5). ``calls.reading`` makes the call and reads it."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings

from calls.bounds import Bound, CallState, Deadline
from calls.limits import Quota
from calls.types import CallOutput, ProviderError, TokenUsage

logger = logging.getLogger(__name__)

# The admin's picture of a call keeps when the first MARKS_HEAD and the last MARKS_TAIL model
# events (and keepalives) arrived: a bounded record however long the stream runs.
MARKS_HEAD, MARKS_TAIL = 200, 50


@dataclass(frozen=True)
class EdgeLimits:
    """How much of an answer is read (architecture.md §15), in bytes after decoding: a non-streamed
    answer, a stream in all, one of its lines and one of its events (past them the call fails,
    naming the limit), an error body (past it the rest is not read: only a bounded part is
    kept) and what is kept of a completed answer (its blocks as JSON; past it the call fails)."""

    body: int
    stream: int
    line: int
    event: int
    error_body: int
    answer: int


def edge_limits() -> EdgeLimits:
    return EdgeLimits(
        body=settings.AGENTOPS_PROVIDER_MAX_BODY_BYTES,
        stream=settings.AGENTOPS_PROVIDER_MAX_STREAM_BYTES,
        line=settings.AGENTOPS_PROVIDER_MAX_LINE_BYTES,
        event=settings.AGENTOPS_PROVIDER_MAX_EVENT_BYTES,
        error_body=settings.AGENTOPS_PROVIDER_MAX_ERROR_BODY_BYTES,
        answer=settings.AGENTOPS_PROVIDER_MAX_ANSWER_BYTES,
    )


def now_ms() -> float:
    return time.time() * 1000


@dataclass
class Timeline:
    sent: float
    headers: float | None = None
    first_event: float | None = None
    first_content: float | None = None
    thinking_start: float | None = None
    last_event: float | None = None
    ended: float | None = None
    model_events: int = 0
    keepalives: int = 0
    last_event_was_thinking_start: bool = False
    header_begun: float | None = None  # the first byte of the answer (its header section)
    event_marks: list[float] = field(default_factory=list)
    # The tails are made at the first mark past the head: most calls never need one, and an
    # empty deque costs 600 bytes, on every stream a worker holds.
    event_tail: deque[float] | tuple[()] = ()
    keepalive_marks: list[float] = field(default_factory=list)
    keepalive_tail: deque[float] | tuple[()] = ()

    def mark_event(self, now: float) -> None:
        self.model_events += 1
        self.event_tail = _marked(self.event_marks, self.event_tail, self.model_events, now)

    def mark_keepalive(self, now: float) -> None:
        self.keepalives += 1
        self.keepalive_tail = _marked(
            self.keepalive_marks, self.keepalive_tail, self.keepalives, now
        )

    def state(self, *, streamed: bool, max_tokens: int | None) -> CallState:
        return CallState(
            sent=self.sent,
            streamed=streamed,
            max_tokens=max_tokens,
            thinking_start=self.thinking_start,
            first_content=self.first_content,
            last_model_event=self.last_event,
            last_event_was_thinking_start=self.last_event_was_thinking_start,
            header_begun=self.header_begun,
            headers=self.headers,
        )


def _marked(
    head: list[float], tail: deque[float] | tuple[()], count: int, now: float
) -> deque[float] | tuple[()]:
    """Keep the ``count``-th mark, ``now``: in ``head`` while it is one of the first MARKS_HEAD,
    else in the tail, made here at its first mark. Returns the tail."""
    if count <= MARKS_HEAD:
        head.append(now)
        return tail
    if not isinstance(tail, deque):
        tail = deque(maxlen=MARKS_TAIL)
    tail.append(now)
    return tail


@dataclass
class CallResult:
    outcome: str  # completed | cut | error | aborted
    timeline: Timeline
    output: CallOutput | None = None
    error: ProviderError | None = None
    bound: Bound | None = None
    bound_deadline: float | None = None
    lateness_ms: float | None = None
    # The token counts the provider reported (a completed call's, or what a stream that did
    # not complete had reported by its end); each None when not reported.
    usage: TokenUsage = field(default_factory=TokenUsage)
    # What the answer's remaining-quota headers said (architecture.md §6.13); None: no answer,
    # or an answer without them.
    quota: Quota | None = None


# Gets the text of the deltas that arrived together (read from the same bytes): a flood of
# tiny deltas costs a call of the hook per read, not one each.
DeltaHook = Callable[[str], Awaitable[None]]
# perform_call hands its caller an ``abort()`` to call, on the engine's loop, to end the call
# (a cancel, a lost lease, a shutdown). The watcher sleeps until the next deadline or item.
AbortHook = Callable[[Callable[[], None]], None]
# Called when the call is sent and when its first content arrives, so in-flight calls can be
# shown live; the final timeline is recorded by the caller from the result.
MilestoneHook = Callable[[str, "Timeline"], Awaitable[None]]
# Sees the provider's response as it arrives, before it is read under the bounds, for a caller
# that relays it (the drop-in endpoints): ``("headers", status)`` first, then ``("sse",
# SseEvent)`` for each event or comment, ``("body", bytes)`` for a whole body, or
# ``("error_body", (status, headers, bytes))``.
WireHook = Callable[[str, Any], Awaitable[None]]
# Called on the loop after each item that leaves the call going, with the timeline and the
# deadline now armed: cheap (the caller throttles what it sends, ``calls.progress``).
ProgressHook = Callable[["Timeline", "Deadline | None"], None]
