"""Wire formats of the two imitated provider APIs.

``OpenAIWire`` speaks OpenAI chat completions (with DeepSeek/OpenRouter-style
``reasoning_content``), ``AnthropicWire`` speaks Anthropic messages.  Both
build whole JSON bodies and individual SSE frames (``bytes``); the ASGI app in
:mod:`inference.standin.app` decides when to send them.  One wire object is made
per request: it carries the ids and the streaming state of that response.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import json
import math
import secrets
import string
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

Stop = Literal["end", "tool", "length"]
Frames = list[bytes]
Headers = list[tuple[bytes, bytes]]

_ALPHANUM = string.ascii_letters + string.digits
KEEPALIVE_COMMENT = b": keepalive\n\n"


def random_id(prefix: str, length: int) -> str:
    return prefix + "".join(secrets.choice(_ALPHANUM) for _ in range(length))


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def estimate_tokens(text: str) -> int:
    return tokens_for_chars(len(text))


def tokens_for_chars(chars: int) -> int:
    """A rough token count: about four characters a token, 0 for nothing."""
    return (chars + 3) // 4


def split_text(text: str, pieces: int) -> list[str]:
    """Split ``text`` into at most ``pieces`` non-empty consecutive parts."""
    if not text:
        return []
    pieces = max(1, min(pieces, len(text)))
    size, extra = divmod(len(text), pieces)
    parts: list[str] = []
    pos = 0
    for i in range(pieces):
        end = pos + size + (1 if i < extra else 0)
        parts.append(text[pos:end])
        pos = end
    return parts


# --------------------------------------------------------------------------- #
# Reading requests
# --------------------------------------------------------------------------- #


def content_text(content: Any) -> str:
    """Text of an OpenAI or Anthropic message ``content`` (str or parts/blocks).

    Only text parts count (``tool_result`` blocks are skipped).
    """
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") != "tool_result":
                text = block.get("text")
                if isinstance(text, str):
                    parts.append(text)
    return "\n".join(parts)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, dict)]


def last_user_text(body: dict[str, Any]) -> str:
    """Text of the last user message that has any text ("" if none)."""
    for message in reversed(_messages(body)):
        if message.get("role") == "user":
            text = content_text(message.get("content"))
            if text:
                return text
    return ""


def last_tool_result(body: dict[str, Any]) -> str | None:
    """Content of the tool result(s) if the LAST message is one, else None.

    OpenAI: a ``tool`` (or legacy ``function``) role message.  Anthropic: a
    user message with ``tool_result`` blocks.
    """
    messages = _messages(body)
    if not messages:
        return None
    last = messages[-1]
    role = last.get("role")
    content = last.get("content")
    if role in ("tool", "function"):
        return content_text(content)
    if role == "user" and isinstance(content, list):
        results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        if results:
            return "\n".join(content_text(b.get("content")) for b in results)
    return None


def first_tool_name(body: dict[str, Any]) -> str | None:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return None
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return str(function["name"])
        if isinstance(tool.get("name"), str):
            return str(tool["name"])
    return None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def contains_marker(body: dict[str, Any], marker: str) -> bool:
    """Whether any message (any string inside it, blocks included) or the
    Anthropic top-level ``system`` contains ``marker``."""
    candidates: list[Any] = [*_messages(body), body.get("system")]
    return any(marker in s for c in candidates for s in _strings(c))


def default_answer_text(body: dict[str, Any]) -> str:
    result = last_tool_result(body)
    if result is not None:
        return f"Tool result received: {result[:200]}"
    return f"Stand-in answer to: {last_user_text(body)[:200]}"


# --------------------------------------------------------------------------- #
# Replies and errors (provider independent)
# --------------------------------------------------------------------------- #


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class Reply:
    """A complete model reply, rendered by either wire."""

    text: str = ""
    text_chunks: int = 1
    thinking: str | None = None
    thinking_chunks: int = 1
    tool: ToolCall | None = None
    stop: Stop = "end"


def format_number(value: float) -> str:
    """``1000.0`` -> ``"1000"``, ``1.5`` -> ``"1.5"``, nan/inf -> ``"nan"``/``"inf"``."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == int(value):
        return str(int(value))
    return repr(value)


def json_number(value: float) -> int | float | str:
    """A JSON-safe number: non-finite values become the strings nan/inf/-inf."""
    if not math.isfinite(value):
        return format_number(value)
    return int(value) if value == int(value) else value


def http_date(wait_ms: float) -> str:
    if math.isnan(wait_ms):
        return "nan"
    if math.isinf(wait_ms):
        return "Fri, 31 Dec 9999 23:59:59 GMT" if wait_ms > 0 else "Thu, 01 Jan 1970 00:00:00 GMT"
    return email.utils.formatdate(max(0.0, time.time() + wait_ms / 1000.0), usegmt=True)


def retry_hints(form: str, wait_ms: float) -> tuple[Headers, dict[str, Any]]:
    """Response headers and extra error-object fields for an ``error`` form."""
    seconds = wait_ms / 1000.0
    if form == "retry-after-ms":
        return [(b"retry-after-ms", format_number(wait_ms).encode())], {}
    if form == "retry-after":
        return [(b"retry-after", format_number(seconds).encode())], {}
    if form == "retry-after-date":
        return [(b"retry-after", http_date(wait_ms).encode())], {}
    if form == "body-ms":
        return [], {"retry_after_ms": json_number(wait_ms)}
    if form == "body-s":
        return [], {"retry_after": json_number(seconds)}
    if form == "body-retry-delay":
        info = {
            "@type": "type.googleapis.com/google.rpc.RetryInfo",
            "retryDelay": f"{format_number(seconds)}s",
        }
        return [], {"details": [info]}
    return [], {}


def default_error_message(status: int) -> str:
    if status == 429:
        return "Rate limit reached for requests (stand-in). Please try again later."
    if status == 529:
        return "Overloaded"
    if status == 401:
        return "Invalid authentication credentials (stand-in)."
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    return f"Stand-in error {status}: {phrase}"


def pad_message(message: str, size: int | None) -> str:
    if size is None or len(message) >= size:
        return message
    if size - len(message) == 1:
        return message + "."
    return message + " " + "x" * (size - len(message) - 1)


def signature(thinking: str) -> str:
    """A plausible-looking (opaque, base64) thinking signature."""
    digest = hashlib.sha256(thinking.encode()).digest() * 3
    return "Eq" + base64.b64encode(digest).decode()


# --------------------------------------------------------------------------- #
# OpenAI chat completions
# --------------------------------------------------------------------------- #

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

    # -- ids, usage ---------------------------------------------------------
    def new_tool_id(self) -> str:
        return random_id("call_", 24)

    def request_id_header(self) -> tuple[bytes, bytes]:
        return (b"x-request-id", random_id("req_", 32).encode())

    def _usage(self, completion_tokens: int) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
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
            "usage": self._usage(estimate_tokens(out)),
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
                "usage": self._usage(tokens_for_chars(self._out_chars)),
            }
        )

    def start(self) -> Frames:
        return [self._chunk({"role": "assistant", "content": ""})]

    def thinking_start(self) -> Frames:
        return [self._chunk({"reasoning_content": ""})]

    def thinking_delta(self, text: str) -> Frames:
        self._out_chars += len(text)
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


# --------------------------------------------------------------------------- #
# Anthropic messages
# --------------------------------------------------------------------------- #

_ANTHROPIC_STOP: dict[Stop, str] = {"end": "end_turn", "tool": "tool_use", "length": "max_tokens"}
_ANTHROPIC_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    if status in _ANTHROPIC_TYPES:
        return _ANTHROPIC_TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


class AnthropicWire:
    api = "anthropic"
    sse_error_event = True

    def __init__(self, body: dict[str, Any]) -> None:
        model = body.get("model")
        self.model = model if isinstance(model, str) else "standin"
        self.id = random_id("msg_01", 22)
        self.input_tokens = estimate_tokens(
            json.dumps([body.get("system", ""), body.get("messages", "")])
        )
        self._index = -1
        self._open: str | None = None
        self._out_chars = 0

    # -- ids, usage ---------------------------------------------------------
    def new_tool_id(self) -> str:
        return random_id("toolu_01", 22)

    def request_id_header(self) -> tuple[bytes, bytes]:
        return (b"request-id", random_id("req_01", 22).encode())

    def _usage(self, output_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }

    def _message(self, content: list[dict[str, Any]], stop: str | None, out: int) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": self._usage(out),
        }

    # -- whole bodies -------------------------------------------------------
    def completion(self, reply: Reply) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        out = ""
        if reply.thinking is not None:
            content.append(
                {
                    "type": "thinking",
                    "thinking": reply.thinking,
                    "signature": signature(reply.thinking),
                }
            )
            out += reply.thinking
        if reply.text:
            content.append({"type": "text", "text": reply.text})
            out += reply.text
        if reply.tool is not None:
            content.append(
                {
                    "type": "tool_use",
                    "id": self.new_tool_id(),
                    "name": reply.tool.name,
                    "input": reply.tool.arguments,
                }
            )
            out += json.dumps(reply.tool.arguments)
        return self._message(content, _ANTHROPIC_STOP[reply.stop], estimate_tokens(out))

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
        """``{"type": "error", "error": {type, message}}``; ``code`` and
        ``param`` have no place in Anthropic errors and are ignored."""
        error: dict[str, Any] = {
            "type": type_ if type_ is not None else anthropic_error_type(status),
            "message": message,
        }
        error.update(extra or {})
        return {"type": "error", "error": error, "request_id": random_id("req_01", 22)}

    # -- stream frames ------------------------------------------------------
    def _event(self, obj: dict[str, Any]) -> bytes:
        return b"event: " + str(obj["type"]).encode() + b"\ndata: " + dumps(obj) + b"\n\n"

    def _close(self) -> Frames:
        if self._open is None:
            return []
        self._open = None
        return [self._event({"type": "content_block_stop", "index": self._index})]

    def _open_block(self, kind: str, block: dict[str, Any]) -> Frames:
        frames = self._close()
        self._index += 1
        self._open = kind
        frames.append(
            self._event(
                {"type": "content_block_start", "index": self._index, "content_block": block}
            )
        )
        return frames

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return self._event({"type": "content_block_delta", "index": self._index, "delta": delta})

    def start(self) -> Frames:
        message = self._message([], None, 1)
        return [self._event({"type": "message_start", "message": message})]

    def thinking_start(self) -> Frames:
        return self._open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})

    def thinking_delta(self, text: str) -> Frames:
        frames = [] if self._open == "thinking" else self.thinking_start()
        self._out_chars += len(text)
        frames.append(self._delta({"type": "thinking_delta", "thinking": text}))
        return frames

    def thinking_end(self, signature: str) -> Frames:
        frames = [self._delta({"type": "signature_delta", "signature": signature})]
        return frames + self._close()

    def text_delta(self, text: str) -> Frames:
        frames = (
            [] if self._open == "text" else self._open_block("text", {"type": "text", "text": ""})
        )
        self._out_chars += len(text)
        frames.append(self._delta({"type": "text_delta", "text": text}))
        return frames

    def tool_start(self, call_id: str, name: str) -> Frames:
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        return self._open_block("tool_use", block)

    def tool_delta(self, piece: str) -> Frames:
        self._out_chars += len(piece)
        return [self._delta({"type": "input_json_delta", "partial_json": piece})]

    def finish(self, stop: Stop) -> Frames:
        frames = self._close()
        output_tokens = tokens_for_chars(self._out_chars)
        frames.append(
            self._event(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": _ANTHROPIC_STOP[stop], "stop_sequence": None},
                    "usage": {"output_tokens": output_tokens},
                }
            )
        )
        frames.append(self._event({"type": "message_stop"}))
        return frames

    def ping(self) -> Frames:
        return [self._event({"type": "ping"})]

    def empty_delta(self) -> Frames:
        """Keepalive for ``empty-deltas``: a text block (opened once) gets ``""`` deltas."""
        return self.text_delta("")

    def error_frame(self, error: dict[str, Any]) -> Frames:
        return [self._event(error)]


Wire = OpenAIWire | AnthropicWire
