"""The stand-in provider over real sockets, parsed by the official SDKs where they apply.

Plain pytest: no Django, no database.  The server is a real subprocess
(``python -m inference.standin --port 0``) shared by the module.
"""

from __future__ import annotations

import email.utils
import json
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai
import pytest

from inference.standin.process import StandinProcess

pytestmark = [pytest.mark.timeout(60)]

QUESTION = "hello there"
ANSWER = f"Stand-in answer to: {QUESTION}"
USER: Any = [{"role": "user", "content": QUESTION}]
APIS = ("openai", "anthropic")


# --------------------------------------------------------------------------- #
# Fixtures and helpers
# --------------------------------------------------------------------------- #


@pytest.fixture(scope="module")
def server() -> Iterator[StandinProcess]:
    process = StandinProcess()
    process.start()
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="module")
def base(server: StandinProcess) -> str:
    return server.base_url


@pytest.fixture(scope="module")
def oai(server: StandinProcess) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=server.openai_base_url, api_key="sk-test", max_retries=0, timeout=10
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def ant(server: StandinProcess) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="sk-ant-test", max_retries=0, timeout=10
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def http(base: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, timeout=10) as client:
        yield client


def path_of(api: str) -> str:
    return "/v1/chat/completions" if api == "openai" else "/v1/messages"


def request_body(model: str, *, stream: bool = False, messages: Any = None) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 256,
        "stream": stream,
        "messages": USER if messages is None else messages,
    }


@dataclass
class SSE:
    event: str | None = None
    data: str | None = None
    comments: list[str] = field(default_factory=list)

    def json(self) -> Any:
        assert self.data is not None
        return json.loads(self.data)


def parse_sse(raw: bytes) -> list[SSE]:
    """Complete SSE frames in ``raw`` (a trailing partial frame is dropped)."""
    frames: list[SSE] = []
    text = raw.decode()
    for block in text.split("\n\n")[:-1]:
        frame = SSE()
        for line in block.split("\n"):
            if line.startswith(":"):
                frame.comments.append(line[1:].strip())
            elif line.startswith("event:"):
                frame.event = line[6:].strip()
            elif line.startswith("data:"):
                frame.data = line[5:].strip()
        frames.append(frame)
    return frames


def read_raw_stream(
    base: str, api: str, model: str, seconds: float
) -> tuple[httpx.Response, bytes, list[float]]:
    """Stream a request for about ``seconds`` (or until it ends or goes quiet that long).

    Returns the response, the bytes and the arrival time of each chunk.
    """
    chunks: list[bytes] = []
    times: list[float] = []
    start = time.monotonic()
    with (
        httpx.Client(timeout=httpx.Timeout(5.0, read=seconds)) as client,
        client.stream("POST", base + path_of(api), json=request_body(model, stream=True)) as resp,
    ):
        try:
            for chunk in resp.iter_raw():
                chunks.append(chunk)
                times.append(time.monotonic() - start)
                if time.monotonic() - start >= seconds:
                    break
        except httpx.ReadTimeout:
            pass
    return resp, b"".join(chunks), times


def openai_stream_text(oai: openai.OpenAI, model: str, messages: Any = None) -> tuple[str, str]:
    text, reasoning, finish = [], [], None
    stream = oai.chat.completions.create(
        model=model, messages=USER if messages is None else messages, stream=True
    )
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text.append(choice.delta.content or "")
        reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
        finish = choice.finish_reason or finish
    assert finish is not None
    return "".join(text), "".join(reasoning) + "|" + finish


def anthropic_text(message: anthropic.types.Message) -> str:
    return "".join(b.text for b in message.content if isinstance(b, anthropic.types.TextBlock))


def assert_all_closed(http: httpx.Client, within: float = 2.0) -> None:
    """The stand-in notices that its clients left and stops serving them promptly."""
    deadline = time.monotonic() + within
    while http.get("/_standin/open").json() != {"open": 0}:
        assert time.monotonic() < deadline, "a stand-in response outlived its client"
        time.sleep(0.02)


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


# --------------------------------------------------------------------------- #
# Errors
# --------------------------------------------------------------------------- #


def error_object(api: str, body: Any) -> dict[str, Any]:
    if api == "anthropic":
        assert body["type"] == "error"
    error = body["error"]
    assert isinstance(error, dict) and isinstance(error["message"], str)
    if api == "openai":
        assert {"message", "type", "param", "code"} <= set(error)
    return error


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize(
    ("form", "header", "header_value", "body_key", "body_value"),
    [
        ("none", None, None, None, None),
        ("retry-after-ms", "retry-after-ms", "2000", None, None),
        ("retry-after", "retry-after", "2", None, None),
        ("body-ms", None, None, "retry_after_ms", 2000),
        ("body-s", None, None, "retry_after", 2),
        (
            "body-retry-delay",
            None,
            None,
            "details",
            [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "2s"}],
        ),
    ],
)
def test_error_forms(
    http: httpx.Client,
    api: str,
    form: str,
    header: str | None,
    header_value: str | None,
    body_key: str | None,
    body_value: Any,
) -> None:
    resp = http.post(path_of(api), json=request_body(f"rate-limit:form={form},wait_ms=2000"))
    assert resp.status_code == 429
    assert resp.headers["content-type"] == "application/json"
    error = error_object(api, resp.json())
    assert error["type"] == ("requests" if api == "openai" else "rate_limit_error")
    if api == "openai":
        assert error["code"] == "rate_limit_exceeded"
    hint_headers = {"retry-after", "retry-after-ms"} & set(resp.headers)
    if header is None:
        assert not hint_headers
    else:
        assert hint_headers == {header} and resp.headers[header] == header_value
    hint_keys = {"retry_after_ms", "retry_after", "details"} & set(error)
    if body_key is None:
        assert not hint_keys
    else:
        assert hint_keys == {body_key} and error[body_key] == body_value


@pytest.mark.parametrize("api", APIS)
def test_error_retry_after_date(http: httpx.Client, api: str) -> None:
    resp = http.post(
        path_of(api), json=request_body("error:status=503,form=retry-after-date,wait_ms=5000")
    )
    assert resp.status_code == 503
    when = email.utils.parsedate_to_datetime(resp.headers["retry-after"]).timestamp()
    assert 2 <= when - time.time() <= 7


@pytest.mark.parametrize(
    ("model", "header", "expected"),
    [
        ("error:form=retry-after,wait_ms=-1500", "retry-after", "-1.5"),
        ("error:form=retry-after,wait_ms=nan", "retry-after", "nan"),
        ("error:form=retry-after-ms,wait_ms=inf", "retry-after-ms", "inf"),
        ("error:form=retry-after-date,wait_ms=nan", "retry-after", "nan"),
    ],
)
def test_error_odd_waits(http: httpx.Client, model: str, header: str, expected: str) -> None:
    resp = http.post(path_of("openai"), json=request_body(model))
    assert resp.status_code == 500
    assert resp.headers[header] == expected


def test_error_odd_waits_in_body_stay_valid_json(http: httpx.Client) -> None:
    resp = http.post(path_of("anthropic"), json=request_body("error:form=body-ms,wait_ms=inf"))
    assert json.loads(resp.text)["error"]["retry_after_ms"] == "inf"


@pytest.mark.parametrize(
    ("model", "status", "openai_type", "openai_code", "anthropic_type"),
    [
        ("rate-limit", 429, "requests", "rate_limit_exceeded", "rate_limit_error"),
        ("overloaded", 529, "overloaded_error", "overloaded", "overloaded_error"),
        ("server-error", 500, "server_error", None, "api_error"),
        ("error:status=502", 502, "server_error", None, "api_error"),
        (
            "error:status=401",
            401,
            "invalid_request_error",
            "invalid_api_key",
            "authentication_error",
        ),
        ("error:status=400", 400, "invalid_request_error", None, "invalid_request_error"),
        (
            "error:status=429,code=insufficient_quota",
            429,
            "insufficient_quota",
            "insufficient_quota",
            "insufficient_quota",
        ),
    ],
)
def test_error_types_follow_provider_conventions(
    http: httpx.Client,
    model: str,
    status: int,
    openai_type: str,
    openai_code: str | None,
    anthropic_type: str,
) -> None:
    resp = http.post(path_of("openai"), json=request_body(model))
    assert resp.status_code == status
    error = error_object("openai", resp.json())
    assert (error["type"], error["code"]) == (openai_type, openai_code)
    assert resp.headers["x-request-id"]
    resp = http.post(path_of("anthropic"), json=request_body(model))
    assert resp.status_code == status
    assert error_object("anthropic", resp.json())["type"] == anthropic_type
    assert resp.headers["request-id"]


def test_error_message_and_size(http: httpx.Client) -> None:
    resp = http.post(
        path_of("openai"), json=request_body("error:status=500,message=boom%21,size=1000000")
    )
    message = resp.json()["error"]["message"]
    assert message.startswith("boom!") and len(message) == 1_000_000


def test_errors_parsed_by_sdks(oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    with pytest.raises(openai.RateLimitError) as oai_rate:
        oai.chat.completions.create(model="rate-limit:form=retry-after-ms", messages=USER)
    assert oai_rate.value.status_code == 429 and oai_rate.value.code == "rate_limit_exceeded"
    with pytest.raises(openai.InternalServerError):
        oai.chat.completions.create(model="server-error", messages=USER, stream=True)
    with pytest.raises(anthropic.RateLimitError):
        ant.messages.create(model="rate-limit", max_tokens=10, messages=USER)
    with pytest.raises(anthropic.InternalServerError) as ant_overloaded:
        ant.messages.create(model="overloaded", max_tokens=10, messages=USER, stream=True)
    assert ant_overloaded.value.status_code == 529


def test_error_frame(oai: openai.OpenAI, ant: anthropic.Anthropic, base: str) -> None:
    seen: list[str] = []
    with pytest.raises(openai.APIError) as oai_error:
        for chunk in oai.chat.completions.create(
            model="overloaded:form=frame", messages=USER, stream=True
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                seen.append(chunk.choices[0].delta.content)
    assert seen and "Overloaded" in str(oai_error.value)

    pieces: list[str] = []
    with (
        pytest.raises(anthropic.APIError) as ant_error,
        ant.messages.stream(model="overloaded:form=frame", max_tokens=10, messages=USER) as stream,
    ):
        for text in stream.text_stream:
            pieces.append(text)
    assert pieces and "overloaded_error" in str(ant_error.value)

    resp, raw, _ = read_raw_stream(base, "openai", "rate-limit:form=frame", 2.0)
    assert resp.status_code == 200
    frames = parse_sse(raw)
    assert frames[-1].json()["error"]["code"] == "rate_limit_exceeded"
    assert all(f.data != "[DONE]" for f in frames)
    resp, raw, _ = read_raw_stream(base, "anthropic", "rate-limit:form=frame", 2.0)
    frames = parse_sse(raw)
    assert frames[-1].event == "error"
    assert frames[-1].json()["error"]["type"] == "rate_limit_error"
    assert "message_stop" not in [f.event for f in frames]


def test_frame_non_streamed_is_a_plain_error(http: httpx.Client) -> None:
    resp = http.post(path_of("anthropic"), json=request_body("overloaded:form=frame"))
    assert resp.status_code == 529


def test_times_counts_per_scenario_string_and_resets(http: httpx.Client) -> None:
    model = "error:status=503,times=2"
    statuses = [
        http.post(path_of("openai"), json=request_body(model)).status_code for _ in range(3)
    ]
    assert statuses == [503, 503, 200]
    # another exact string has its own counter
    other = "error:times=2,status=503"
    assert http.post(path_of("anthropic"), json=request_body(other)).status_code == 503
    resp = http.post(path_of("anthropic"), json=request_body(model))
    assert resp.status_code == 200 and resp.json()["content"][0]["text"] == ANSWER
    http.delete("/_standin/requests")
    assert http.post(path_of("openai"), json=request_body(model)).status_code == 503


@pytest.mark.parametrize("api", APIS)
def test_refuse_context_length_auth(http: httpx.Client, api: str) -> None:
    resp = http.post(path_of(api), json=request_body("refuse"))
    assert resp.status_code == 400
    error = error_object(api, resp.json())
    assert error["message"] == "temperature is not supported with this model"
    assert error["type"] == "invalid_request_error"

    resp = http.post(path_of(api), json=request_body("context-length"))
    assert resp.status_code == 400
    error = error_object(api, resp.json())
    if api == "openai":
        assert error["code"] == "context_length_exceeded"
        assert error["message"].startswith("This model's maximum context length is")
    else:
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("prompt is too long: ")
        assert " tokens > " in error["message"] and error["message"].endswith(" maximum")

    resp = http.post(path_of(api), json=request_body("auth"))
    assert resp.status_code == 401
    error = error_object(api, resp.json())
    if api == "anthropic":
        assert error["type"] == "authentication_error"


def test_sdk_exceptions_for_fixed_errors(oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    with pytest.raises(openai.BadRequestError) as too_long:
        oai.chat.completions.create(model="context-length", messages=USER)
    assert too_long.value.code == "context_length_exceeded"
    with pytest.raises(openai.AuthenticationError):
        oai.chat.completions.create(model="auth", messages=USER)
    with pytest.raises(anthropic.AuthenticationError):
        ant.messages.create(model="auth", max_tokens=10, messages=USER)
    with pytest.raises(anthropic.BadRequestError, match="not supported"):
        ant.messages.create(model="refuse", max_tokens=10, messages=USER)


# --------------------------------------------------------------------------- #
# Poison and empty completions
# --------------------------------------------------------------------------- #


def test_poison(oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    poisoned: Any = [
        {"role": "user", "content": "first POISON question"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": QUESTION},
    ]
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model="poison", messages=poisoned)
    clean = oai.chat.completions.create(model="poison", messages=USER)
    assert clean.choices[0].message.content == ANSWER

    in_block: Any = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "x", "input": {}}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": "data with a BAD-APPLE inside"}],
                }
            ],
        },
    ]
    with pytest.raises(anthropic.BadRequestError):
        ant.messages.create(model="poison:marker=BAD-APPLE", max_tokens=10, messages=in_block)
    with ant.messages.stream(model="poison", max_tokens=10, messages=in_block) as stream:
        final = stream.get_final_message()
    assert anthropic_text(final) == "Tool result received: data with a BAD-APPLE inside"


def test_length_empty(oai: openai.OpenAI, ant: anthropic.Anthropic) -> None:
    completion = oai.chat.completions.create(model="length-empty", messages=USER)
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == ""
    assert completion.choices[0].message.tool_calls is None
    text, tail = openai_stream_text(oai, "length-empty")
    assert text == "" and tail == "|length"

    message = ant.messages.create(model="length-empty", max_tokens=10, messages=USER)
    assert message.stop_reason == "max_tokens" and message.content == []
    with ant.messages.stream(model="length-empty", max_tokens=10, messages=USER) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "max_tokens" and final.content == []


# --------------------------------------------------------------------------- #
# Keepalives, silence, hangs, trickles
# --------------------------------------------------------------------------- #


def is_keepalive(api: str, scenario: str, frame: SSE) -> bool:
    if scenario == "comments":
        return frame.comments == ["keepalive"] and frame.data is None
    if api == "anthropic":
        if scenario == "pings":
            return frame.event == "ping"
        body = frame.json()
        empty = {"type": "text_delta", "text": ""}
        return bool(body["type"] == "content_block_delta" and body["delta"] == empty)
    body = frame.json()
    if scenario == "pings":
        return bool(body["choices"] == [] and "usage" in body)
    return bool(body["choices"][0]["delta"] == {"content": ""})


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("scenario", ["pings", "comments", "empty-deltas"])
def test_keepalive_scenarios_send_only_keepalives(base: str, api: str, scenario: str) -> None:
    resp, raw, _ = read_raw_stream(base, api, f"{scenario}:interval_ms=40", 0.3)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    frames = parse_sse(raw)
    first = frames.pop(0).json()
    if api == "openai":
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    else:
        assert first["type"] == "message_start"
        if scenario == "empty-deltas":
            start = frames.pop(0)
            assert start.event == "content_block_start"
            assert start.json()["content_block"] == {"type": "text", "text": ""}
    assert len(frames) >= 4
    assert all(is_keepalive(api, scenario, f) for f in frames)


@pytest.mark.parametrize("scenario", ["pings", "comments", "empty-deltas"])
def test_keepalive_scenarios_end_with_an_answer(
    oai: openai.OpenAI, ant: anthropic.Anthropic, scenario: str
) -> None:
    model = f"{scenario}:interval_ms=20,duration_ms=100"
    text, tail = openai_stream_text(oai, model)
    assert text == ANSWER and tail.endswith("|stop")
    with ant.messages.stream(model=model, max_tokens=10, messages=USER) as stream:
        final = stream.get_final_message()
    assert anthropic_text(final) == ANSWER and final.stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("api", "model", "stream"),
    [
        ("openai", "hang", False),
        ("anthropic", "hang", True),
        ("anthropic", "pings", False),
        ("openai", "endless", False),
    ],
)
def test_no_headers_within_300ms(
    base: str, http: httpx.Client, api: str, model: str, stream: bool
) -> None:
    start = time.monotonic()
    with pytest.raises(httpx.ReadTimeout), httpx.Client(timeout=httpx.Timeout(5.0, read=0.3)) as c:
        c.post(base + path_of(api), json=request_body(model, stream=stream))
    assert time.monotonic() - start >= 0.29
    assert_all_closed(http)


@pytest.mark.parametrize("api", APIS)
def test_silent_and_silent_after_content(base: str, http: httpx.Client, api: str) -> None:
    resp, raw, _ = read_raw_stream(base, api, "silent", 0.3)
    assert resp.status_code == 200
    assert len(parse_sse(raw)) == 1  # the stream start, then nothing
    resp, raw, _ = read_raw_stream(base, api, "silent-after-content:after_chunks=2", 0.3)
    frames = parse_sse(raw)
    text = "".join(
        f.json()["choices"][0]["delta"].get("content", "")
        if api == "openai"
        else f.json().get("delta", {}).get("text", "")
        for f in frames
    )
    assert text == "Stand-in partial answer part 1 "
    # non-streamed: the headers come, the body never does
    with (
        httpx.Client(timeout=httpx.Timeout(5.0, read=0.3)) as client,
        client.stream("POST", base + path_of(api), json=request_body("silent")) as response,
    ):
        assert response.status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            response.read()
    assert_all_closed(http)


def test_trickle_non_streamed(oai: openai.OpenAI, base: str) -> None:
    model = "trickle:interval_ms=10,bytes=40,duration_ms=250"
    start = time.monotonic()
    completion = oai.chat.completions.create(model=model, messages=USER)
    assert time.monotonic() - start >= 0.2
    assert completion.choices[0].message.content == ANSWER
    with (
        httpx.Client(timeout=5) as client,
        client.stream("POST", base + "/v1/messages", json=request_body(model)) as resp,
    ):
        total = int(resp.headers["content-length"])
        chunks = list(resp.iter_raw())
    assert len(chunks) >= 10 and sum(map(len, chunks)) == total == 1000
    assert json.loads(b"".join(chunks))["content"][0]["text"] == ANSWER


def test_trickle_streamed(ant: anthropic.Anthropic, base: str) -> None:
    _, raw, times = read_raw_stream(base, "openai", "trickle:interval_ms=30", 0.3)
    assert set(raw) <= set(b":\n") and len(raw) >= 5
    assert times[0] >= 0.0 and len(times) >= 5
    with ant.messages.stream(
        model="trickle:interval_ms=10,bytes=3,duration_ms=100", max_tokens=10, messages=USER
    ) as stream:
        final = stream.get_final_message()
    assert anthropic_text(final) == ANSWER


def test_endless_streams_until_the_client_leaves(oai: openai.OpenAI, http: httpx.Client) -> None:
    stream = oai.chat.completions.create(model="endless:interval_ms=5", messages=USER, stream=True)
    words = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            words.append(chunk.choices[0].delta.content)
        if len(words) == 10:
            break
    stream.close()
    assert words == [f"word{i} " for i in range(10)]
    assert_all_closed(http)


# --------------------------------------------------------------------------- #
# Scenario selection and the request record
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("api", APIS)
def test_bad_scenarios_are_400_naming_the_problem(http: httpx.Client, api: str) -> None:
    for model, needle in [
        ("no-such-thing", "'no-such-thing'"),
        ("answer:chunks=zero", "'chunks'"),
        ("answer:colour=blue", "'colour'"),
        ("error:form=sideways", "'form'"),
        ("answer:chunks", "'chunks'"),
    ]:
        resp = http.post(path_of(api), json=request_body(model))
        assert resp.status_code == 400, model
        error = error_object(api, resp.json())
        assert error["type"] == "invalid_request_error"
        assert needle in error["message"], (model, error["message"])


def test_requests_are_recorded(http: httpx.Client, oai: openai.OpenAI) -> None:
    assert http.delete("/_standin/requests").json() == {"ok": True}
    before = time.time()
    completion = oai.chat.completions.create(
        model="gpt-4o",
        messages=USER,
        extra_headers={"X-Standin-Scenario": "answer:text=from%20header", "X-Trace": "t-1"},
    )
    assert completion.choices[0].message.content == "from header"
    assert completion.model == "gpt-4o"
    http.post(path_of("anthropic"), json=request_body("auth", stream=True))
    http.post(path_of("anthropic"), content=b"{not json")
    records = http.get("/_standin/requests").json()
    assert [r["path"] for r in records] == [
        path_of("openai"),
        path_of("anthropic"),
        path_of("anthropic"),
    ]
    first, second, third = records
    assert first["model"] == "gpt-4o"
    assert first["scenario"] == "answer:text=from%20header"
    assert first["stream"] is False
    assert first["body"] == {"model": "gpt-4o", "messages": USER}
    assert first["headers"]["x-trace"] == "t-1"
    assert first["headers"]["authorization"] == "Bearer sk-test"
    assert before - 1 <= first["received_at"] <= time.time() + 1
    assert second["scenario"] == "auth" and second["stream"] is True
    assert second["body"] == request_body("auth", stream=True)
    assert third["body"] == "{not json" and third["model"] is None


def test_unknown_paths_and_methods(http: httpx.Client) -> None:
    assert http.post("/v1/embeddings", json={}).status_code == 404
    assert http.get("/v1/messages").status_code == 405
    assert http.get("/_standin/nope").status_code == 404
    resp = http.post("/chat/completions", json=request_body("answer"))
    assert resp.json()["choices"][0]["message"]["content"] == ANSWER


# --------------------------------------------------------------------------- #
# Process lifecycle
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_cleanly_with_open_requests(sig: signal.Signals) -> None:
    standin = StandinProcess()
    standin.start()
    results: list[Any] = []

    def hang() -> None:
        try:
            results.append(
                httpx.post(standin.base_url + "/v1/messages", json=request_body("hang"), timeout=10)
            )
        except httpx.HTTPError as exc:
            results.append(exc)

    thread = threading.Thread(target=hang)
    thread.start()
    with httpx.stream(
        "POST",
        standin.base_url + "/v1/chat/completions",
        json=request_body("endless", stream=True),
        timeout=10,
    ) as resp:
        lines = resp.iter_lines()
        next(lines)
        process = standin.process
        assert process is not None
        time.sleep(0.1)
        start = time.monotonic()
        process.send_signal(sig)
        for _ in lines:  # the stream ends instead of running forever
            pass
        assert process.wait(timeout=5) == 0
        assert time.monotonic() - start < 3
    thread.join(timeout=5)
    assert results and isinstance(results[0], httpx.Response) and results[0].status_code == 503
    assert standin.stop() == 0
