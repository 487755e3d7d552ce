"""The overflow table (architecture.md §5.6, "Context-length refusals"): each provider's own
wording of a request over its window classifies as ``context_length``, with the window it
states when it states one. Wordings are the providers' as their users reported them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from calls.classify import classify_frame, classify_http, stated_context_limit

NOW = 1_700_000_000_000.0


def openai_body(message: str, code: Any = "context_length_exceeded", **extra: Any) -> str:
    return json.dumps(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": code,
                **extra,
            }
        }
    )


# (status, body, stated limit)
HTTP_CASES = [
    pytest.param(
        400,
        openai_body(
            "This model's maximum context length is 128000 tokens. However, your messages "
            "resulted in 204308 tokens. Please reduce the length of the messages."
        ),
        128000,
        id="openai-chat",
    ),
    pytest.param(
        400,
        openai_body(
            "Your input exceeds the context window of this model. "
            "Please adjust your input and try again.",
            param="input",
        ),
        None,
        id="openai-responses",
    ),
    pytest.param(
        400,
        json.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 208310 tokens > 200000 maximum",
                },
            }
        ),
        200000,
        id="anthropic-prompt-too-long",
    ),
    pytest.param(
        400,
        json.dumps(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "input length and `max_tokens` exceed context limit: "
                    "189136 + 20000 > 204648, decrease input length or `max_tokens` and "
                    "try again",
                },
            }
        ),
        204648,
        id="anthropic-input-plus-max-tokens",
    ),
    pytest.param(
        413,
        json.dumps(
            {
                "type": "error",
                "error": {
                    "type": "request_too_large",
                    "message": "Request exceeds the maximum allowed number of bytes.",
                },
            }
        ),
        None,
        id="anthropic-413",
    ),
    pytest.param(
        400,
        json.dumps(
            {
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, you "
                "requested 4201 tokens (3177 in the messages, 1024 in the completion). Please "
                "reduce the length of the messages or completion.",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        ),
        4096,
        id="vllm",
    ),
    pytest.param(
        400,
        json.dumps(
            {
                "error": {
                    "message": "'max_tokens' or 'max_completion_tokens' is too large: 8000. "
                    "This model's maximum context length is 4096 tokens and your request has "
                    "2778 input tokens (8000 > 4096 - 2778). None",
                    "type": "BadRequestError",
                    "param": None,
                    "code": 400,
                }
            }
        ),
        4096,
        id="vllm-max-tokens",
    ),
    pytest.param(
        400,
        json.dumps(
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size. try increasing "
                    "the context size or enable context shift",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 14429,
                    "n_ctx": 8192,
                }
            }
        ),
        8192,
        id="llama.cpp",
    ),
    pytest.param(
        500,
        json.dumps(
            {
                "error": {
                    "code": 500,
                    "message": "the request exceeds the available context size. try increasing "
                    "the context size or enable context shift",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 1407,
                    "n_ctx": 256,
                }
            }
        ),
        256,
        id="llama.cpp-as-500",
    ),
    pytest.param(
        400,
        json.dumps({"error": "the input length exceeds the context length"}),
        None,
        id="ollama",
    ),
    pytest.param(
        400,
        json.dumps(
            {
                "error": {
                    "message": "litellm.BadRequestError: litellm.ContextWindowExceededError: "
                    'AnthropicError - {"type":"error","error":{"type":"invalid_request_error",'
                    '"message":"prompt is too long: 209303 tokens > 200000 maximum"}}\n'
                    "Received Model Group=anthropic/claude-3-5-sonnet-20241022\n"
                    "Available Model Group Fallbacks=None",
                    "type": None,
                    "param": None,
                    "code": "400",
                }
            }
        ),
        200000,
        id="litellm-proxy",
    ),
    pytest.param(
        400,
        openai_body(
            "This model's maximum context length is 32768 tokens. However, you requested 35969 "
            "tokens (9969 in the messages, 26000 in the completion). Please reduce the length "
            "of the messages or completion."
        ),
        32768,
        id="azure-chat",
    ),
    pytest.param(
        400,
        openai_body(
            "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted "
            "in 509178 tokens. Please reduce the length of the messages."
        ),
        272000,
        id="azure-configured-limit",
    ),
]


@pytest.mark.parametrize(("status", "body", "limit"), HTTP_CASES)
def test_each_providers_overflow_is_context_length_with_its_stated_window(
    status: int, body: str, limit: int | None
) -> None:
    error = classify_http(status, {}, body, NOW)
    assert error.type == "context_length", error
    assert not error.retryable
    assert error.http_status == status
    assert error.context_limit == limit
    assert (error.as_dict().get("context_limit")) == limit


@pytest.mark.parametrize(
    ("payload", "limit"),
    [
        pytest.param(
            {
                "type": "error",
                "sequence_number": 2,
                "error": {
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                    "message": "Your input exceeds the context window of this model. Please "
                    "adjust your input and try again.",
                    "param": "input",
                },
            },
            None,
            id="responses-stream-error",
        ),
        pytest.param(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 208310 tokens > 200000 maximum",
                },
            },
            200000,
            id="anthropic-stream-error",
        ),
        pytest.param(
            {
                "error": {
                    "message": "This model's maximum context length is 16000 tokens. However, "
                    "your messages resulted in 16500 tokens. Please reduce the length of the "
                    "messages.",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
            },
            16000,
            id="openai-stream-error",
        ),
        pytest.param(
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size. try increasing "
                    "the context size or enable context shift",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": 14429,
                    "n_ctx": 8192,
                }
            },
            8192,
            id="llama.cpp-stream-error",
        ),
    ],
)
def test_an_overflow_in_a_stream_frame_is_context_length(
    payload: dict[str, Any], limit: int | None
) -> None:
    error = classify_frame(payload, NOW)
    assert error.type == "context_length", error
    assert error.context_limit == limit


def test_a_plain_invalid_request_states_no_window() -> None:
    error = classify_http(
        400, {}, openai_body("temperature is not supported with this model", code=None), NOW
    )
    assert error.type == "invalid_request" and error.context_limit is None
    assert "context_limit" not in error.as_dict()


def test_a_server_error_that_is_no_overflow_stays_a_server_error() -> None:
    error = classify_http(500, {}, json.dumps({"error": {"message": "boom", "code": 500}}), NOW)
    assert error.type == "server" and error.retryable


def llama_cpp_body(status: int) -> str:
    return json.dumps(
        {
            "error": {
                "code": status,
                "message": "the request exceeds the available context size. try increasing "
                "the context size or enable context shift",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": 14429,
                "n_ctx": 8192,
            }
        }
    )


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        # llama.cpp's code is its status; its type names the overflow.
        pytest.param(400, llama_cpp_body(400), "exceed_context_size_error", id="llama.cpp"),
        pytest.param(500, llama_cpp_body(500), "exceed_context_size_error", id="llama.cpp-500"),
        pytest.param(
            400,
            openai_body("This model's maximum context length is 128000 tokens."),
            "context_length_exceeded",
            id="openai",
        ),
    ],
)
def test_an_overflow_is_reported_with_the_code_that_names_it(
    status: int, body: str, code: str
) -> None:
    error = classify_http(status, {}, body, NOW)
    assert (error.type, error.provider_code) == ("context_length", code)


@pytest.mark.parametrize("status", [500, 502])
def test_an_overflow_code_is_an_overflow_behind_any_status_whatever_the_message(
    status: int,
) -> None:
    # A gateway answering with a status of its own and a message that names no window.
    body = json.dumps({"error": {"message": "upstream refused", "code": "context_length_exceeded"}})
    error = classify_http(status, {}, body, NOW)
    assert (error.type, error.retryable, error.http_status) == ("context_length", False, status)
    assert error.provider_code == "context_length_exceeded"


@pytest.mark.parametrize(
    ("message", "window"),
    [
        ("This model's maximum context length is 128,000 tokens.", 128_000),
        ("prompt is too long: 201,873 tokens > 200,000 maximum", 200_000),
        ("This model's maximum context length is 1 tokens.", 1),
        # A window of 0 tokens is none: learned, it would refuse every request.
        ("This model's maximum context length is 0 tokens.", None),
        ("This model's maximum context length is 0,000 tokens.", None),
    ],
)
def test_a_stated_window_reads_as_a_whole_number_of_tokens_above_zero(
    message: str, window: int | None
) -> None:
    assert stated_context_limit(message) == window


@pytest.mark.parametrize(
    ("n_ctx", "window"),
    [(8192, 8192), (1, 1), (0, None), (-1, None), (True, None), ("8192", None), (8192.0, None)],
)
def test_llama_cpps_n_ctx_is_a_window_only_as_a_whole_number_above_zero(
    n_ctx: Any, window: int | None
) -> None:
    message = "the request exceeds the available context size"
    assert stated_context_limit(message, {"n_ctx": n_ctx}) == window


def test_the_window_a_message_states_comes_before_n_ctx() -> None:
    message = "This model's maximum context length is 4096 tokens."
    assert stated_context_limit(message, {"n_ctx": 8192}) == 4096
    assert stated_context_limit(message, None) == 4096
    assert stated_context_limit("too long", None) is None
