"""The stand-in's OpenAI Responses API (``POST /v1/responses``), read by the official SDK."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.devtools.standin.common import ANSWER, QUESTION, parse_sse

pytestmark = [pytest.mark.timeout(60)]


def events(
    base: str, model: str, seconds: float = 5.0, **extra: Any
) -> list[tuple[str | None, dict[str, Any]]]:
    body = {"model": model, "input": QUESTION, "stream": True, **extra}
    with httpx.Client(timeout=httpx.Timeout(5.0, read=seconds)) as client:
        raw = b""
        with client.stream("POST", base + "/v1/responses", json=body) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            start = time.monotonic()
            try:
                for chunk in resp.iter_raw():
                    raw += chunk
                    if time.monotonic() - start > seconds:
                        break
            except httpx.ReadTimeout:
                pass
    return [(f.event, f.json()) for f in parse_sse(raw) if f.data is not None]


def test_a_non_streamed_answer_is_a_response_object(oai: openai.OpenAI) -> None:
    response = oai.responses.create(model="answer", input=QUESTION)
    assert response.status == "completed" and response.output_text == ANSWER
    assert response.usage is not None
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.usage.output_tokens_details.reasoning_tokens == 0


def test_a_streamed_answer_is_text_deltas_then_completed(oai: openai.OpenAI) -> None:
    stream = oai.responses.create(model="answer:chunks=4", input=QUESTION, stream=True)
    seen = list(stream)
    types = [e.type for e in seen]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    deltas = [e.delta for e in seen if e.type == "response.output_text.delta"]
    assert len(deltas) == 4 and "".join(deltas) == ANSWER
    completed = seen[-1].response  # type: ignore[union-attr]
    assert completed.output_text == ANSWER and completed.usage is not None
    assert [e.sequence_number for e in seen] == list(range(len(seen)))


def test_think_streams_a_reasoning_item_before_the_message(oai: openai.OpenAI) -> None:
    seen = list(oai.responses.create(model="think", input=QUESTION, stream=True))
    added = [
        e.item.type  # type: ignore[union-attr]
        for e in seen
        if e.type == "response.output_item.added"
    ]
    assert added == ["reasoning", "message"]
    thought = "".join(
        e.delta  # type: ignore[union-attr]
        for e in seen
        if e.type == "response.reasoning_summary_text.delta"
    )
    assert thought == f"Thinking about: {QUESTION}"
    usage = seen[-1].response.usage  # type: ignore[union-attr]
    assert (
        usage is not None
        and usage.output_tokens_details.reasoning_tokens == (len(thought) + 3) // 4
    )


def test_think_is_silent_after_the_reasoning_item_starts(base: str) -> None:
    start = time.monotonic()
    frames = events(base, "think:silent_ms=400")
    assert frames[-1][0] == "response.completed"
    assert time.monotonic() - start >= 0.4


def test_a_tool_call_streams_its_arguments_and_a_result_round_trip_answers(
    oai: openai.OpenAI,
) -> None:
    tools: Any = [
        {"type": "function", "name": "search", "parameters": {"type": "object", "properties": {}}}
    ]
    with oai.responses.stream(model="tool", input=QUESTION, tools=tools) as stream:
        final = stream.get_final_response()
    (call,) = final.output
    assert call.type == "function_call" and call.name == "search"
    assert json.loads(call.arguments) == {"query": QUESTION}
    answered = oai.responses.create(
        model="tool",
        tools=tools,
        input=[
            {"role": "user", "content": QUESTION},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": "search",
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "42"},
        ],
    )
    assert answered.output_text == "Tool result received: 42"


def test_pings_repeat_the_in_progress_event_and_nothing_else(base: str) -> None:
    frames = events(base, "pings:interval_ms=40", seconds=0.4)
    names = [name for name, _ in frames]
    assert names[0] == "response.created"
    assert len(names) >= 5 and set(names[1:]) == {"response.in_progress"}


def test_silent_sends_the_stream_start_then_nothing(base: str) -> None:
    frames = events(base, "silent", seconds=0.5)
    assert [name for name, _ in frames] == ["response.created", "response.in_progress"]


@pytest.mark.parametrize(
    ("form", "header", "field"),
    [
        ("retry-after-ms", ("retry-after-ms", "2000"), None),
        ("retry-after", ("retry-after", "2"), None),
        ("retry-after-date", ("retry-after", None), None),
        ("body-ms", None, ("retry_after_ms", 2000)),
        ("body-s", None, ("retry_after", 2)),
        (
            "body-retry-delay",
            None,
            (
                "details",
                [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2s"}],
            ),
        ),
    ],
)
def test_a_429_states_its_wait_in_each_form(base: str, form: str, header: Any, field: Any) -> None:
    response = httpx.post(
        base + "/v1/responses",
        json={"model": f"error:status=429,form={form},wait_ms=2000", "input": QUESTION},
    )
    assert response.status_code == 429
    error = response.json()["error"]
    assert error["code"] == "rate_limit_exceeded"
    if header is not None:
        name, value = header
        assert name in response.headers
        if value is not None:
            assert response.headers[name] == value
    if field is not None:
        assert error[field[0]] == field[1]


def test_an_error_frame_is_an_error_event_then_response_failed(base: str) -> None:
    frames = events(base, "error:status=429,form=frame,wait_ms=1500")
    names = [name for name, _ in frames]
    assert names[-2:] == ["error", "response.failed"]
    error = frames[-2][1]
    assert error["type"] == "error" and error["code"] == "rate_limit_exceeded"
    failed = frames[-1][1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "rate_limit_exceeded"
