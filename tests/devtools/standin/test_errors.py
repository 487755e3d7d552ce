"""Errors in every form (status, stated waits, frames), refusals, poisoned histories, empty length
stops."""

from __future__ import annotations

import email.utils
import json
import time
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.devtools.standin.common import (
    ANSWER,
    APIS,
    QUESTION,
    USER,
    anthropic_text,
    error_object,
    openai_stream_text,
    parse_sse,
    path_of,
    read_raw_stream,
    request_body,
)

pytestmark = [pytest.mark.timeout(60)]


# --------------------------------------------------------------------------- #
# Errors
# --------------------------------------------------------------------------- #


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
