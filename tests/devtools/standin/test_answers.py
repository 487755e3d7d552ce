"""Answers, thinking and tool calls in both wire formats, parsed by the official SDKs."""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from devtools.standin.process import StandinProcess
from tests.devtools.standin.common import (
    ANSWER,
    QUESTION,
    USER,
    anthropic_text,
    openai_stream_text,
    request_body,
)

pytestmark = [pytest.mark.timeout(60)]


# --------------------------------------------------------------------------- #
# Basics
# --------------------------------------------------------------------------- #


def test_health_and_listening_line(server: StandinProcess, http: httpx.Client) -> None:
    assert server.port > 0
    assert server.base_url == f"http://127.0.0.1:{server.port}"
    assert http.get("/_standin/health").json() == {"ok": True}


def test_openai_answer_non_streamed(oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.create(model="answer", messages=USER)
    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.model == "answer"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == ANSWER
    assert choice.finish_reason == "stop"
    assert completion.usage is not None and completion.usage.total_tokens > 0


def test_openai_answer_streamed(oai: openai.OpenAI) -> None:
    chunks = list(
        oai.chat.completions.create(
            model="answer:chunks=4,interval_ms=1",
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    deltas = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(deltas) == 4 and "".join(deltas) == ANSWER
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_anthropic_answer_non_streamed(ant: anthropic.Anthropic) -> None:
    message = ant.messages.create(model="answer", max_tokens=256, messages=USER)
    assert message.id.startswith("msg_")
    assert message.type == "message" and message.role == "assistant"
    assert anthropic_text(message) == ANSWER
    assert message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_a_user_message_of_several_text_blocks_is_answered_to_its_last(
    ant: anthropic.Anthropic,
) -> None:
    # Consecutive user turns arrive as one message (a note first, then the turn's text): a
    # model reads the turn's text last and answers it.
    blocks: Any = [
        {"type": "text", "text": "[context-trim] The 2 oldest rows were set aside."},
        {"type": "text", "text": QUESTION},
    ]
    message = ant.messages.create(
        model="answer", max_tokens=256, messages=[{"role": "user", "content": blocks}]
    )
    assert anthropic_text(message) == ANSWER


def test_anthropic_answer_streamed(ant: anthropic.Anthropic) -> None:
    with ant.messages.stream(
        model="answer:chunks=5,interval_ms=1", max_tokens=256, messages=USER
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) == 5 and "".join(pieces) == ANSWER
    assert anthropic_text(final) == ANSWER
    assert final.stop_reason == "end_turn"


def test_fixed_text_is_percent_decoded_and_delay_holds_headers(oai: openai.OpenAI) -> None:
    start = time.monotonic()
    completion = oai.chat.completions.create(
        model="answer:text=Hi%2C%20you,delay_ms=150", messages=USER
    )
    assert time.monotonic() - start >= 0.14
    assert completion.choices[0].message.content == "Hi, you"


# --------------------------------------------------------------------------- #
# Thinking and tools
# --------------------------------------------------------------------------- #


def test_openai_think(oai: openai.OpenAI) -> None:
    completion = oai.chat.completions.create(model="think", messages=USER)
    message = completion.choices[0].message
    assert getattr(message, "reasoning_content", None) == f"Thinking about: {QUESTION}"
    assert message.content == ANSWER
    text, tail = openai_stream_text(oai, "think:thinking_chunks=4,interval_ms=1")
    assert text == ANSWER
    assert tail == f"Thinking about: {QUESTION}|stop"


def test_anthropic_think(ant: anthropic.Anthropic) -> None:
    message = ant.messages.create(
        model="think",
        max_tokens=2048,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=USER,
    )
    thinking = message.content[0]
    assert isinstance(thinking, anthropic.types.ThinkingBlock)
    assert thinking.thinking == f"Thinking about: {QUESTION}" and thinking.signature
    assert anthropic_text(message) == ANSWER
    with ant.messages.stream(model="think:interval_ms=1", max_tokens=2048, messages=USER) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert "thinking" in kinds and "signature" in kinds
    block = final.content[0]
    assert isinstance(block, anthropic.types.ThinkingBlock)
    assert block.thinking == f"Thinking about: {QUESTION}" and block.signature
    assert anthropic_text(final) == ANSWER


def test_think_silent_ms_gap_after_thinking_starts(base: str) -> None:
    start = time.monotonic()
    seen: dict[str, float] = {}
    with httpx.stream(
        "POST",
        base + "/v1/messages",
        json=request_body("think:silent_ms=300,interval_ms=1", stream=True),
        timeout=5,
    ) as resp:
        for line in resp.iter_lines():
            if '"content_block_start"' in line and "thinking" not in seen:
                assert '"type":"thinking"' in line
                seen["thinking"] = time.monotonic() - start
            if '"thinking_delta"' in line and "delta" not in seen:
                seen["delta"] = time.monotonic() - start
    assert seen["delta"] - seen["thinking"] >= 0.28


def test_openai_tool_round_trip(oai: openai.OpenAI) -> None:
    tools: Any = [
        {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
    ]
    completion = oai.chat.completions.create(model="tool", messages=USER, tools=tools)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "search"
    assert json.loads(call.function.arguments) == {"query": QUESTION}

    # streamed: reassemble the pieces
    name, arguments, ids, finish = "", "", set(), None
    for chunk in oai.chat.completions.create(
        model="tool:interval_ms=1", messages=USER, tools=tools, stream=True
    ):
        choice_chunk = chunk.choices[0]
        for delta in choice_chunk.delta.tool_calls or []:
            assert delta.index == 0
            if delta.id:
                ids.add(delta.id)
            if delta.function and delta.function.name:
                name += delta.function.name
            if delta.function and delta.function.arguments:
                arguments += delta.function.arguments
        finish = choice_chunk.finish_reason or finish
    assert name == "search" and len(ids) == 1 and finish == "tool_calls"
    assert json.loads(arguments) == {"query": QUESTION}

    history: Any = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "42 results"},
    ]
    done = oai.chat.completions.create(model="tool", messages=history, tools=tools)
    assert done.choices[0].finish_reason == "stop"
    assert done.choices[0].message.content == "Tool result received: 42 results"


def test_anthropic_tool_round_trip(ant: anthropic.Anthropic) -> None:
    tools: Any = [{"name": "search", "input_schema": {"type": "object"}}]
    with ant.messages.stream(
        model="tool:interval_ms=1", max_tokens=256, messages=USER, tools=tools
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    (block,) = final.content
    assert isinstance(block, anthropic.types.ToolUseBlock)
    assert block.id.startswith("toolu_") and block.name == "search"
    assert block.input == {"query": QUESTION}

    history: Any = [
        *USER,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True)]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "42 results"}],
        },
    ]
    message = ant.messages.create(model="tool", max_tokens=256, messages=history, tools=tools)
    assert message.stop_reason == "end_turn"
    assert anthropic_text(message) == "Tool result received: 42 results"


def test_tool_name_and_arguments_params(ant: anthropic.Anthropic) -> None:
    message = ant.messages.create(
        model="tool:name=fetch,arguments=%7B%22url%22%3A%20%22x%22%2C%20%22n%22%3A%202%7D",
        max_tokens=256,
        messages=USER,
    )
    (block,) = message.content
    assert isinstance(block, anthropic.types.ToolUseBlock)
    assert block.name == "fetch" and block.input == {"url": "x", "n": 2}
