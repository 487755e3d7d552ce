"""What each item read from a provider's answer means for the call (``calls.reading``): the
timeline moved on, and the call's result once it is over, an answer kept only within what is
kept of one."""

from __future__ import annotations

import json
from typing import Any

from agentops.text import bound_text, untrusted_json
from calls.adapters import Adapter
from calls.classify import classify_http
from calls.client import (
    CallResult,
    Timeline,
    now_ms,
)
from calls.types import CallOutput, ProviderError


def answer_bounded(result: CallResult, limit: int) -> CallResult:
    """A whole answer's ``result``, or the error it becomes when what it would store passes
    ``limit``. (A stream is counted as it arrives instead: ``over_limit``.)"""
    if result.output is None or not result.output.blocks:
        return result
    size = len(json.dumps(result.output.blocks, ensure_ascii=False).encode())
    if size <= limit:
        return result
    return over_limit(result.timeline, result.output, size, limit)


def over_limit(timeline: Timeline, output: CallOutput, size: int, limit: int) -> CallResult:
    """The error an answer past what is kept of one ends as: terminal (``unknown``, like a
    runaway length stop), since the same request would bring the same answer to pay for again;
    what the provider said it used is kept (it was made, and paid for), nothing of the answer."""
    error = ProviderError(
        type="unknown",
        provider_code="answer_too_large",
        message=f"the provider's answer holds more than {limit} bytes of text, thinking and "
        f"tool-call arguments ({size} read), more than is kept of one answer "
        "(AGENTOPS_PROVIDER_MAX_ANSWER_BYTES); it was not read further nor requested again",
    )
    kept = CallOutput(stop_reason=output.stop_reason, usage=output.usage, model=output.model)
    return CallResult(outcome="error", timeline=timeline, error=error, output=kept)


def item_handled(
    item: tuple[Any, ...],
    adapter: Adapter,
    reader: Any,
    timeline: Timeline,
    deltas: list[str] | None,
) -> CallResult | None:
    """Apply one item to the timeline, its text deltas added to ``deltas``; return a result
    when the call is over."""
    now = now_ms()
    kind = item[0]
    if kind == "headers":
        timeline.headers = now  # its own instant: no keepalive (a plain 429 showed one)
        return None
    if kind == "error_body":
        status, headers = item[1], item[2]
        return CallResult(
            outcome="error",
            timeline=timeline,
            error=classify_http(status, headers, item[3].decode("utf-8", "replace"), now),
        )
    if kind == "error":
        return CallResult(outcome="error", timeline=timeline, error=item[1])
    if kind == "bug":
        message = bound_text(
            f"the call's reading failed in agentops itself: {type(item[1]).__name__}: {item[1]}"
        )
        return CallResult(
            outcome="error", timeline=timeline, error=ProviderError(type="unknown", message=message)
        )
    if kind == "body":
        try:
            data = untrusted_json(item[1])
        except ValueError:
            return CallResult(
                outcome="error",
                timeline=timeline,
                error=ProviderError(
                    type="unknown",
                    provider_code="not_json",
                    message="the provider's answer is not JSON",
                ),
            )
        timeline.first_event = timeline.last_event = now
        timeline.mark_event(now)
        output = adapter.parse_body(data)
        if output.blocks:
            timeline.first_content = now
        return CallResult(outcome="completed", timeline=timeline, output=output)
    if kind == "eof":
        output = reader.output()
        if output.stop_reason:
            return CallResult(outcome="completed", timeline=timeline, output=output)
        return CallResult(
            outcome="error",
            timeline=timeline,
            error=ProviderError(
                type="network",
                message="the stream ended before the response was complete",
                retryable=True,
            ),
        )
    # An SSE event.
    for progress in reader.feed(item[1], now):
        if progress.error is not None:
            return CallResult(outcome="error", timeline=timeline, error=progress.error)
        if progress.model_event:
            timeline.mark_event(now)
            if timeline.first_event is None:
                timeline.first_event = now
            timeline.last_event = now
            timeline.last_event_was_thinking_start = progress.thinking_start
            if progress.thinking_start:
                # The newest thinking block's start: its allowance runs from there.
                timeline.thinking_start = now
            if progress.content and timeline.first_content is None:
                timeline.first_content = now
        else:
            timeline.mark_keepalive(now)
        if progress.text_delta and deltas is not None:
            deltas.append(progress.text_delta)
        if progress.done:
            output = reader.output()
            return CallResult(outcome="completed", timeline=timeline, output=output)
    return None
