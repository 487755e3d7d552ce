"""The ``openai-responses`` provider kind against the stand-in over sockets: the adapter's
request, its reading of the stream under the progress bounds (architecture.md §5.2, §5.3) and the
classification of its failures (§5.6)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from calls.adapters import ResponsesAdapter, adapter_for
from calls.bounds import BoundsSettings
from calls.client import CallResult
from calls.reading import perform_call
from calls.sse import SseEvent
from calls.types import CompiledRequest, Message
from tests.factories import AgentFactory, ProviderFactory
from tests.turns.test_turns import submit, wait_turn

# Before content 300 ms; a thinking block's allowance 100 tokens / 100 per s = 1 s.
BOUNDS = BoundsSettings(
    before_content_ms=300,
    between_events_ms=300,
    think_tokens_per_second=100,
    flat_minimum_ms=3000,
    absolute_ms=5000,
)


def request(
    model: str, *, stream: bool = True, max_tokens: int | None = 100, **extra: Any
) -> CompiledRequest:
    return CompiledRequest(
        model=model,
        system="be brief",
        max_tokens=max_tokens,
        stream=stream,
        messages=[Message(role="user", blocks=[{"type": "text", "text": "hello"}])],
        **extra,
    )


async def call(standin: str, model: str, **kwargs: Any) -> CallResult:
    adapter = ResponsesAdapter()
    req = request(model, **kwargs)
    wire = adapter.build(base_url=f"{standin}/v1", api_key="", request=req)
    return await perform_call(
        adapter=adapter, wire=wire, streamed=req.stream, max_tokens=req.max_tokens, bounds=BOUNDS
    )


def test_the_kind_picks_the_responses_adapter() -> None:
    assert isinstance(adapter_for("openai-responses"), ResponsesAdapter)


def test_the_request_is_a_responses_body() -> None:
    req = request("m", tools=[{"name": "search", "input_schema": {"type": "object"}}])
    req.messages.append(
        Message(
            role="assistant",
            blocks=[{"type": "tool_call", "id": "call_1", "name": "search", "arguments": {"q": 1}}],
        )
    )
    req.messages.append(
        Message(
            role="user", blocks=[{"type": "tool_result", "tool_call_id": "call_1", "content": "42"}]
        )
    )
    wire = ResponsesAdapter().build(base_url="http://x/v1/", api_key="k", request=req)
    assert wire.url == "http://x/v1/responses" and wire.headers["authorization"] == "Bearer k"
    assert wire.body["instructions"] == "be brief" and wire.body["max_output_tokens"] == 100
    assert wire.body["input"] == [
        {"role": "user", "content": "hello"},
        {"type": "function_call", "call_id": "call_1", "name": "search", "arguments": '{"q": 1}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "42"},
    ]
    assert wire.body["tools"] == [
        {"type": "function", "name": "search", "description": "", "parameters": {"type": "object"}}
    ]


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_completes_with_its_text_and_usage(standin: str, stream: bool) -> None:
    result = await call(standin, "answer", stream=stream)
    assert result.outcome == "completed", result.error
    assert result.output is not None and result.output.text == "Stand-in answer to: hello"
    assert result.output.stop_reason == "end_turn"
    assert result.output.usage["output_tokens"] > 0


@pytest.mark.parametrize("stream", [True, False])
async def test_a_tool_call_is_read_with_its_arguments(standin: str, stream: bool) -> None:
    result = await call(standin, "tool:name=search", stream=stream)
    assert result.outcome == "completed" and result.output is not None
    (tool,) = result.output.tool_calls
    assert (
        tool["name"] == "search"
        and tool["arguments"] == {"query": "hello"}
        and tool["id"].startswith("call_")
    )
    assert result.output.stop_reason == "tool_use"


async def test_reasoning_longer_than_the_before_content_bound_within_its_allowance_is_not_cut(
    standin: str,
) -> None:
    # 700 ms of silence after the reasoning item starts: past before_content (300 ms), within
    # the thinking allowance (1 s from the block's start).
    result = await call(standin, "think:silent_ms=700")
    assert result.outcome == "completed", result.error
    assert result.output is not None and result.output.blocks[0]["type"] == "thinking"
    t = result.timeline
    assert t.thinking_start is not None and t.first_content is not None
    assert t.first_content - t.sent > 700


async def test_the_same_reasoning_without_the_allowance_is_cut_before_content(standin: str) -> None:
    result = await call(standin, "think:silent_ms=700", max_tokens=None)
    assert (
        result.outcome == "cut"
        and result.bound is not None
        and result.bound.value == "before_content"
    )


async def test_a_ping_only_stream_is_cut_before_content(standin: str) -> None:
    result = await call(standin, "pings:interval_ms=30")
    assert (
        result.outcome == "cut"
        and result.bound is not None
        and result.bound.value == "before_content"
    )
    assert result.timeline.keepalives >= 5 and result.timeline.first_content is None
    assert result.lateness_ms is not None and 0 <= result.lateness_ms < 200


async def test_empty_text_deltas_are_keepalives(standin: str) -> None:
    result = await call(standin, "empty-deltas:interval_ms=30")
    assert (
        result.outcome == "cut"
        and result.bound is not None
        and result.bound.value == "before_content"
    )


async def test_a_stated_wait_is_classified_from_the_http_error(standin: str) -> None:
    result = await call(standin, "error:status=429,form=retry-after-ms,wait_ms=2500")
    assert result.outcome == "error" and result.error is not None
    assert (
        result.error.type == "rate_limit"
        and result.error.http_status == 429
        and result.error.retry_after_ms == 2500
    )


async def test_an_error_event_in_the_stream_is_classified(standin: str) -> None:
    result = await call(standin, "error:status=429,form=frame")
    assert result.outcome == "error" and result.error is not None
    assert (
        result.error.type == "rate_limit"
        and result.error.retryable
        and result.error.http_status == 429
    )
    assert result.timeline.first_content is not None  # a text delta came before the error


def test_a_wait_stated_in_an_error_event_is_read() -> None:
    reader = ResponsesAdapter().reader()
    frame = {
        "type": "error",
        "code": "rate_limit_exceeded",
        "message": "slow down",
        "retry_after_ms": 1500,
    }
    (progress,) = reader.feed(SseEvent("error", json.dumps(frame)), 0)
    assert (
        progress.error is not None
        and progress.error.type == "rate_limit"
        and progress.error.retry_after_ms == 1500
    )


def test_response_failed_is_classified_by_its_error_code() -> None:
    reader = ResponsesAdapter().reader()
    frame = {
        "type": "response.failed",
        "response": {"status": "failed", "error": {"code": "server_error", "message": "boom"}},
    }
    (progress,) = reader.feed(SseEvent("response.failed", json.dumps(frame)), 0)
    assert progress.done and progress.error is not None
    assert (
        progress.error.type == "server"
        and progress.error.retryable
        and progress.error.message == "boom"
    )
    reader = ResponsesAdapter().reader()
    frame = {
        "type": "response.failed",
        "response": {
            "status": "failed",
            "error": {"code": "context_length_exceeded", "message": "too long"},
        },
    }
    (progress,) = reader.feed(SseEvent("response.failed", json.dumps(frame)), 0)
    assert (
        progress.error is not None
        and progress.error.type == "context_length"
        and not progress.error.retryable
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("workers")
def test_a_turn_on_a_responses_provider_answers(api: Client, standin: str) -> None:
    provider = ProviderFactory.create(
        name="standin-responses", kind="openai-responses", base_url=f"{standin}/v1"
    )
    agent = AgentFactory.create(provider=provider, model="think", max_tokens=200)
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert turn["status"] == "succeeded", turn
    assert turn["output"]["content"] == "Stand-in answer to: alice: hello"
    assert turn["calls"][0]["outcome"] == "completed"
