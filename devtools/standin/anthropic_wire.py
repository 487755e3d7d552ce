"""The Anthropic messages wire format.

:class:`AnthropicWire` builds whole ``message`` bodies, ``{"type": "error"}``
bodies and the ``event:`` + ``data:`` SSE frames of one response (it tracks the
open content block); the scenario playback in
:mod:`devtools.standin.playback` decides when to send them.  What both
formats share lives in :mod:`devtools.standin.wire`.
"""

from __future__ import annotations

import json
from typing import Any

from devtools.standin.wire import (
    Frames,
    Reply,
    Stop,
    dumps,
    estimate_tokens,
    random_id,
    signature,
    tokens_for_chars,
)

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
        self.cache_read = self.cache_write = 0  # the scenario's, part of input_tokens above

    # -- ids, usage ---------------------------------------------------------
    def new_tool_id(self) -> str:
        return random_id("toolu_01", 22)

    def request_id_header(self) -> tuple[bytes, bytes]:
        return (b"request-id", random_id("req_01", 22).encode())

    def _usage(self, output_tokens: int) -> dict[str, Any]:
        # Anthropic's input_tokens leaves the cache's reads and writes out.
        return {
            "input_tokens": max(0, self.input_tokens - self.cache_read - self.cache_write),
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": self.cache_write,
            "cache_read_input_tokens": self.cache_read,
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
