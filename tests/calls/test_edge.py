"""The provider edge (architecture.md §15) against a provider that misbehaves on purpose
(``tests.hostile``, a real server over loopback): each answer that breaks HTTP or a limit ends
the call with a classified error naming what was refused, reading stays bounded in memory, and
text that cannot be stored arrives made safe."""

from __future__ import annotations

import time
from typing import Any

import psutil
import pytest

from calls.adapters import OpenAIAdapter
from calls.bounds import BoundsSettings
from calls.client import CallResult
from calls.reading import perform_call
from calls.types import CompiledRequest, Message

BOUNDS = BoundsSettings(
    before_content_ms=20_000,
    between_events_ms=20_000,
    think_tokens_per_second=100,
    flat_minimum_ms=30_000,
    absolute_ms=60_000,
)
MiB = 1 << 20


async def call(base: str, model: str, *, stream: bool) -> CallResult:
    adapter = OpenAIAdapter()
    request = CompiledRequest(
        model=model,
        system="",
        max_tokens=100,
        stream=stream,
        messages=[Message(role="user", blocks=[{"type": "text", "text": "hi"}])],
    )
    wire = adapter.build(base_url=f"{base}/v1", api_key="", request=request)
    return await perform_call(
        adapter=adapter, wire=wire, streamed=stream, max_tokens=100, bounds=BOUNDS
    )


REFUSED = [
    # (model, streamed, type, provider_code, words in the message)
    ("gzip-bomb", False, "server", "response_too_large", "AGENTOPS_PROVIDER_MAX_BODY_BYTES"),
    ("gzip-bomb", True, "server", "line_too_long", "AGENTOPS_PROVIDER_MAX_LINE_BYTES"),
    ("repeated-header", False, "server", "bad_response", "Too many headers"),
    ("endless-headers", True, "server", "bad_response", "Too many headers"),
    ("huge-body", False, "server", "response_too_large", "larger than 16777216 bytes"),
    ("long-line", True, "server", "line_too_long", "longer than 1048576 bytes"),
    ("data-no-blank", True, "server", "event_too_large", "AGENTOPS_PROVIDER_MAX_EVENT_BYTES"),
    ("status-999", False, "server", "bad_status", "HTTP status 999"),
    ("redirect", False, "unknown", "redirect", "a redirect, which is not followed"),
    ("close-mid-chunk", True, "network", None, "cut short"),
]


@pytest.mark.parametrize(
    ("model", "stream", "kind", "code", "words"),
    REFUSED,
    ids=[f"{m}-{'stream' if s else 'body'}" for m, s, *_ in REFUSED],
)
async def test_an_answer_past_a_limit_or_outside_http_ends_the_call_naming_what_was_refused(
    hostile: str,
    hostile_requests: Any,
    model: str,
    stream: bool,
    kind: str,
    code: str | None,
    words: str,
) -> None:
    process = psutil.Process()
    before = process.memory_info().rss
    result = await call(hostile, model, stream=stream)
    grown = process.memory_info().rss - before
    assert result.outcome == "error" and result.error is not None, result
    assert (result.error.type, result.error.provider_code) == (kind, code), result.error
    assert words in result.error.message, result.error.message
    assert result.error.retryable is (kind in ("server", "network"))
    assert grown < 100 * MiB, f"the call grew the process by {grown / MiB:.0f} MiB"
    assert hostile_requests() == [{"model": model, "stream": stream}]


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_nul_and_lone_surrogates_in_an_answer_arrive_as_replacement_characters(
    hostile: str, stream: bool
) -> None:
    result = await call(hostile, "nul", stream=stream)
    assert result.outcome == "completed" and result.output is not None, result
    assert result.output.text == "a\ufffdb\ufffdc"


@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_bytes_that_are_not_utf8_arrive_as_replacement_characters(
    hostile: str, stream: bool
) -> None:
    result = await call(hostile, "bad-utf8", stream=stream)
    assert result.outcome == "completed" and result.output is not None, result
    assert result.output.text == "caf\ufffd \ufffd\ufffd ok"


async def test_an_error_body_with_a_raw_nul_is_classified_with_the_nul_replaced(
    hostile: str,
) -> None:
    result = await call(hostile, "nul-error", stream=False)
    assert result.error is not None and (result.error.type, result.error.http_status) == (
        "invalid_request",
        400,
    )
    assert result.error.message == "refused \ufffd because \ufffd of reasons"


async def test_a_header_section_that_trickles_is_cut_by_the_before_content_bound(
    hostile: str,
) -> None:
    # Not streamed: the whole-call bound is 21 s here (setup plus the allowance of 100
    # tokens); a header section that began must be whole within the before-content bound.
    bounds = BoundsSettings(
        before_content_ms=1_000,
        between_events_ms=20_000,
        think_tokens_per_second=100,
        flat_minimum_ms=30_000,
        absolute_ms=60_000,
    )
    adapter = OpenAIAdapter()
    request = CompiledRequest(
        model="trickle-headers",
        system="",
        max_tokens=100,
        stream=False,
        messages=[Message(role="user", blocks=[{"type": "text", "text": "hi"}])],
    )
    wire = adapter.build(base_url=f"{hostile}/v1", api_key="", request=request)
    began = time.monotonic()
    result = await perform_call(
        adapter=adapter, wire=wire, streamed=False, max_tokens=100, bounds=bounds
    )
    assert result.outcome == "cut" and result.bound is not None, result
    assert result.bound.value == "before_content"
    assert time.monotonic() - began < 5
    assert result.error is not None and "header section" in result.error.message


async def test_an_answer_past_what_is_kept_of_one_fails_naming_the_setting(hostile: str) -> None:
    result = await call(hostile, "tool-args-50", stream=True)  # a 50 MiB tool-call argument
    assert result.outcome == "error" and result.error is not None, result
    assert result.error.provider_code == "answer_too_large"
    assert "AGENTOPS_PROVIDER_MAX_ANSWER_BYTES" in result.error.message
    assert result.output is not None and result.output.blocks == []  # nothing of it is kept


async def test_an_answer_within_what_is_kept_is_whole(hostile: str) -> None:
    result = await call(hostile, "tool-args-2", stream=True)
    assert result.outcome == "completed" and result.output is not None, result
    (tool_call,) = result.output.tool_calls
    assert len(tool_call["arguments"]["a"]) == 2 * MiB


@pytest.mark.parametrize("stream", [False, True])
async def test_control_characters_in_a_providers_error_show_escaped_and_act_on_nothing(
    hostile: str, stream: bool
) -> None:
    result = await call(hostile, "esc-error", stream=stream)
    assert result.error is not None and result.error.http_status == 400
    assert result.error.message == "refused \\x1b[31mred\\x1b[0m\\x07 and\\x0dover"
    assert result.error.provider_code == "\\x1b[2Jwiped"


@pytest.mark.parametrize("stream", [False, True])
async def test_an_error_answer_counts_no_keepalive(hostile: str, stream: bool) -> None:
    result = await call(hostile, "esc-error", stream=stream)
    assert result.outcome == "error" and result.timeline.headers is not None
    assert result.timeline.keepalives == 0  # the headers have their own instant


async def test_an_html_error_page_is_a_server_error_whose_message_is_the_page(hostile: str) -> None:
    result = await call(hostile, "html-error", stream=False)
    assert result.error is not None and (
        result.error.type,
        result.error.http_status,
        result.error.retryable,
    ) == ("server", 502, True)
    assert "<h1>Bad Gateway</h1>" in result.error.message


async def test_two_answers_in_one_write_are_read_as_two_and_the_second_is_never_taken_for_the_next_call(
    hostile: str, hostile_requests: Any
) -> None:
    first = await call(hostile, "two-responses", stream=False)
    assert (
        first.outcome == "completed" and first.output is not None and first.output.text == "first"
    )
    following = await call(hostile, "answer", stream=False)
    assert (
        following.outcome == "completed"
        and following.output is not None
        and following.output.text == "Hello there"
    )
    assert [r["model"] for r in hostile_requests()] == ["two-responses", "answer"]


async def test_token_counts_no_column_holds_are_not_reported(hostile: str) -> None:
    result = await call(hostile, "big-usage", stream=False)
    assert result.outcome == "completed"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (None, None)
