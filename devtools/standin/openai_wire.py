"""The OpenAI chat-completions wire format.

:class:`OpenAIWire` builds whole ``chat.completion`` bodies, ``{"error": ...}``
bodies and the ``data: {chat.completion.chunk}`` SSE frames of one response
(thinking the DeepSeek/OpenRouter way, as ``reasoning_content``); the scenario
playback in :mod:`devtools.standin.playback` decides when to send them.  What
both formats share lives in :mod:`devtools.standin.wire`.
"""

from __future__ import annotations

import json
import time
from typing import Any

from devtools.standin.wire import (
    Frames,
    Reply,
    Stop,
    dumps,
    estimate_tokens,
    random_id,
    tokens_for_chars,
)

_OPENAI_FINISH: dict[Stop, str] = {"end": "stop", "tool": "tool_calls", "length": "length"}


class OpenAIWire:
    api = "openai"
    sse_error_event = False

    def __init__(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        self.model = model if isinstance(model, str) else "standin"
        self.id = random_id("chatcmpl-", 29)
        self.created = int(time.time())
        self.prompt_tokens = estimate_tokens(json.dumps(body.get("messages", "")))
        options = body.get("stream_options")
        self.include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        self._tool_index = -1
        self._out_chars = 0
        self._reasoning_chars = 0
        self.cache_read = self.cache_write = 0  # the scenario's (OpenAI reports no writes)

    # -- ids, usage ---------------------------------------------------------
    def new_tool_id(self) -> str:
        return random_id("call_", 24)

    def request_id_header(self) -> tuple[bytes, bytes]:
        return (b"x-request-id", random_id("req_", 32).encode())

    def _usage(self, completion_tokens: int, reasoning_tokens: int = 0) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": min(self.cache_read, self.prompt_tokens)},
            "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        }

    # -- whole bodies -------------------------------------------------------
    def completion(self, reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": None}
        out = reply.text
        if reply.thinking is not None:
            message["reasoning_content"] = reply.thinking
            out += reply.thinking
        if reply.tool is not None:
            arguments = json.dumps(reply.tool.arguments)
            out += arguments
            message["content"] = reply.text or None
            message["tool_calls"] = [
                {
                    "id": self.new_tool_id(),
                    "type": "function",
                    "function": {"name": reply.tool.name, "arguments": arguments},
                }
            ]
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_standin",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": _OPENAI_FINISH[reply.stop],
                }
            ],
            "usage": self._usage(
                estimate_tokens(out), estimate_tokens(reply.thinking) if reply.thinking else 0
            ),
        }

    def error_body(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        type_: str | None = None,
        param: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``{"error": {message, type, param, code}}``; ``type``/``code`` follow
        OpenAI's convention for ``status`` unless overridden."""
        if status == 429:
            etype, default_code = "requests", "rate_limit_exceeded"
        elif status == 401:
            etype, default_code = "invalid_request_error", "invalid_api_key"
        elif status == 529:
            etype, default_code = "overloaded_error", "overloaded"
        elif status >= 500:
            etype, default_code = "server_error", None
        else:
            etype, default_code = "invalid_request_error", None
        if code == "insufficient_quota":
            etype = code  # as OpenAI does
        error: dict[str, Any] = {
            "message": message,
            "type": type_ if type_ is not None else etype,
            "param": param,
            "code": code if code is not None else default_code,
        }
        error.update(extra or {})
        return {"error": error}

    # -- stream frames ------------------------------------------------------
    def _frame(self, obj: dict[str, Any]) -> bytes:
        return b"data: " + dumps(obj) + b"\n\n"

    def _chunk(
        self,
        delta: dict[str, Any] | None,
        finish: str | None = None,
    ) -> bytes:
        choices = []
        if delta is not None:
            choices.append({"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish})
        return self._frame(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": "fp_standin",
                "choices": choices,
            }
        )

    def _usage_chunk(self) -> bytes:
        return self._frame(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": "fp_standin",
                "choices": [],
                "usage": self._usage(
                    tokens_for_chars(self._out_chars), tokens_for_chars(self._reasoning_chars)
                ),
            }
        )

    def start(self) -> Frames:
        return [self._chunk({"role": "assistant", "content": ""})]

    def thinking_start(self) -> Frames:
        return [self._chunk({"reasoning_content": ""})]

    def thinking_delta(self, text: str) -> Frames:
        self._out_chars += len(text)
        self._reasoning_chars += len(text)
        return [self._chunk({"reasoning_content": text})]

    def thinking_end(self, signature: str) -> Frames:
        return []

    def text_delta(self, text: str) -> Frames:
        self._out_chars += len(text)
        return [self._chunk({"content": text})]

    def tool_start(self, call_id: str, name: str) -> Frames:
        self._tool_index += 1
        call = {
            "index": self._tool_index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        return [self._chunk({"tool_calls": [call]})]

    def tool_delta(self, piece: str) -> Frames:
        self._out_chars += len(piece)
        call = {"index": self._tool_index, "function": {"arguments": piece}}
        return [self._chunk({"tool_calls": [call]})]

    def finish(self, stop: Stop) -> Frames:
        frames = [self._chunk({}, _OPENAI_FINISH[stop])]
        if self.include_usage:
            frames.append(self._usage_chunk())
        frames.append(b"data: [DONE]\n\n")
        return frames

    def ping(self) -> Frames:
        """Keepalive for the ``pings`` scenario: a usage-only chunk."""
        return [self._usage_chunk()]

    def empty_delta(self) -> Frames:
        return [self._chunk({"content": ""})]

    def error_frame(self, error: dict[str, Any]) -> Frames:
        return [self._frame(error)]
