"""The OpenAI Responses API wire format (``POST /v1/responses``).

:class:`ResponsesWire` builds whole ``response`` objects, the ``{"error": ...}`` bodies (the
same as chat completions') and the ``event:`` + ``data:`` SSE frames of one streamed response:
``response.created``, ``response.in_progress``, ``response.output_item.added`` /
``.done`` around each output item (``reasoning``, ``message``, ``function_call``),
``response.reasoning_summary_part.added``, ``response.reasoning_summary_text.delta``,
``response.content_part.added``, ``response.output_text.delta`` / ``.done``,
``response.function_call_arguments.delta`` / ``.done`` and ``response.completed`` (or
``response.incomplete`` at the output limit) carrying the usage. Keepalives: ``pings`` repeat
``response.in_progress``; ``empty-deltas`` are ``response.output_text.delta`` with ``""``.
An error frame is an ``error`` event, then ``response.failed``.

A request's ``input`` (a string or a list of items) is read through :func:`as_messages`, so
the scenarios find the last user text and tool results as in the other formats.
"""

from __future__ import annotations

import json
import time
from typing import Any

from devtools.standin.openai_wire import OpenAIWire
from devtools.standin.wire import (
    Frames,
    Reply,
    Stop,
    dumps,
    estimate_tokens,
    random_id,
    tokens_for_chars,
)


def as_messages(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses request as the chat-shaped body the scenarios read (``messages``,
    ``tools``): ``input`` text is a user message, ``function_call_output`` items are tool
    results, ``instructions`` is the system text."""
    raw = body.get("input")
    messages: list[dict[str, Any]] = []
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
    elif isinstance(raw, list):
        for item in raw:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "function_call_output":
                messages.append({"role": "tool", "content": str(item.get("output", ""))})
            elif item.get("type") == "function_call":
                messages.append({"role": "assistant", "content": None})
            elif isinstance(item.get("role"), str):
                content = item.get("content")
                if isinstance(content, list):
                    content = [
                        {"type": "text", "text": part.get("text", "")}
                        for part in content
                        if isinstance(part, dict) and isinstance(part.get("text"), str)
                    ]
                messages.append({"role": item["role"], "content": content})
    view = {k: v for k, v in body.items() if k != "input"}
    view["messages"] = messages
    if isinstance(body.get("instructions"), str):
        view["system"] = body["instructions"]
    return view


class ResponsesWire(OpenAIWire):
    """The error bodies and request-id header are chat completions' (``api`` stays
    ``openai`` for the scenarios' error codes); bodies and frames are the Responses API's."""

    api = "openai"
    sse_error_event = True

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(body)
        self.id = random_id("resp_", 32)
        self.created = int(time.time())
        self.prompt_tokens = estimate_tokens(json.dumps(body.get("input", "")))
        self._seq = 0
        self._index = -1
        self._item: dict[str, Any] | None = None
        self._items: list[dict[str, Any]] = []

    # -- usage and the response object --------------------------------------
    def responses_usage(self, output_tokens: int, reasoning_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": min(self.cache_read, self.prompt_tokens)},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": self.prompt_tokens + output_tokens,
        }

    def _response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None,
        stop: Stop | None = None,
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if stop == "length" else None,
            "usage": usage,
        }

    @staticmethod
    def _status(stop: Stop) -> str:
        return "incomplete" if stop == "length" else "completed"

    # -- whole bodies -------------------------------------------------------
    def completion(self, reply: Reply) -> dict[str, Any]:
        output: list[dict[str, Any]] = []
        out, reasoning = "", 0
        if reply.thinking is not None:
            output.append(
                {
                    "type": "reasoning",
                    "id": random_id("rs_", 32),
                    "summary": [{"type": "summary_text", "text": reply.thinking}],
                }
            )
            out += reply.thinking
            reasoning = estimate_tokens(reply.thinking)
        if reply.text or reply.tool is None:
            output.append(
                {
                    "type": "message",
                    "id": random_id("msg_", 32),
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": []}]
                    if reply.text
                    else [],
                }
            )
            out += reply.text
        if reply.tool is not None:
            arguments = json.dumps(reply.tool.arguments)
            output.append(
                {
                    "type": "function_call",
                    "id": random_id("fc_", 32),
                    "call_id": self.new_tool_id(),
                    "name": reply.tool.name,
                    "arguments": arguments,
                    "status": "completed",
                }
            )
            out += arguments
        usage = self.responses_usage(estimate_tokens(out), reasoning)
        return self._response(self._status(reply.stop), output, usage, reply.stop)

    # -- stream frames ------------------------------------------------------
    def _event(self, obj: dict[str, Any]) -> bytes:
        obj["sequence_number"] = self._seq
        self._seq += 1
        return b"event: " + str(obj["type"]).encode() + b"\ndata: " + dumps(obj) + b"\n\n"

    def _close(self) -> Frames:
        item = self._item
        if item is None:
            return []
        self._item = None
        frames: Frames = []
        if item["type"] == "message" and item["content"]:
            part = item["content"][0]
            frames.append(
                self._event(
                    {
                        "type": "response.output_text.done",
                        "item_id": item["id"],
                        "output_index": self._index,
                        "content_index": 0,
                        "text": part["text"],
                    }
                )
            )
            frames.append(
                self._event(
                    {
                        "type": "response.content_part.done",
                        "item_id": item["id"],
                        "output_index": self._index,
                        "content_index": 0,
                        "part": part,
                    }
                )
            )
        elif item["type"] == "reasoning" and item["summary"]:
            part = item["summary"][0]
            frames.append(
                self._event(
                    {
                        "type": "response.reasoning_summary_text.done",
                        "item_id": item["id"],
                        "output_index": self._index,
                        "summary_index": 0,
                        "text": part["text"],
                    }
                )
            )
            frames.append(
                self._event(
                    {
                        "type": "response.reasoning_summary_part.done",
                        "item_id": item["id"],
                        "output_index": self._index,
                        "summary_index": 0,
                        "part": part,
                    }
                )
            )
        elif item["type"] == "function_call":
            frames.append(
                self._event(
                    {
                        "type": "response.function_call_arguments.done",
                        "item_id": item["id"],
                        "output_index": self._index,
                        "arguments": item["arguments"],
                    }
                )
            )
        item["status"] = "completed"
        frames.append(
            self._event(
                {"type": "response.output_item.done", "output_index": self._index, "item": item}
            )
        )
        self._items.append(item)
        return frames

    def _open(self, item: dict[str, Any]) -> Frames:
        frames = self._close()
        self._index += 1
        self._item = item
        shown = json.loads(json.dumps(item))
        frames.append(
            self._event(
                {"type": "response.output_item.added", "output_index": self._index, "item": shown}
            )
        )
        return frames

    def start(self) -> Frames:
        return [
            self._event(
                {"type": "response.created", "response": self._response("in_progress", [], None)}
            ),
            self._event(
                {
                    "type": "response.in_progress",
                    "response": self._response("in_progress", [], None),
                }
            ),
        ]

    def thinking_start(self) -> Frames:
        frames = self._open({"type": "reasoning", "id": random_id("rs_", 32), "summary": []})
        return frames

    def thinking_delta(self, text: str) -> Frames:
        frames = (
            []
            if self._item is not None and self._item["type"] == "reasoning"
            else self.thinking_start()
        )
        item = self._item
        assert item is not None
        if not item["summary"]:
            item["summary"].append({"type": "summary_text", "text": ""})
            frames.append(
                self._event(
                    {
                        "type": "response.reasoning_summary_part.added",
                        "item_id": item["id"],
                        "output_index": self._index,
                        "summary_index": 0,
                        "part": {"type": "summary_text", "text": ""},
                    }
                )
            )
        item["summary"][0]["text"] += text
        self._out_chars += len(text)
        self._reasoning_chars += len(text)
        frames.append(
            self._event(
                {
                    "type": "response.reasoning_summary_text.delta",
                    "item_id": item["id"],
                    "output_index": self._index,
                    "summary_index": 0,
                    "delta": text,
                }
            )
        )
        return frames

    def thinking_end(self, signature: str) -> Frames:
        return self._close()

    def _message_item(self) -> tuple[Frames, dict[str, Any]]:
        if self._item is not None and self._item["type"] == "message":
            return [], self._item
        frames = self._open(
            {
                "type": "message",
                "id": random_id("msg_", 32),
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        )
        assert self._item is not None
        return frames, self._item

    def text_delta(self, text: str) -> Frames:
        frames, item = self._message_item()
        if not item["content"]:
            item["content"].append({"type": "output_text", "text": "", "annotations": []})
            frames.append(
                self._event(
                    {
                        "type": "response.content_part.added",
                        "item_id": item["id"],
                        "output_index": self._index,
                        "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": []},
                    }
                )
            )
        item["content"][0]["text"] += text
        self._out_chars += len(text)
        frames.append(
            self._event(
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": self._index,
                    "content_index": 0,
                    "delta": text,
                }
            )
        )
        return frames

    def tool_start(self, call_id: str, name: str) -> Frames:
        return self._open(
            {
                "type": "function_call",
                "id": random_id("fc_", 32),
                "call_id": call_id,
                "name": name,
                "arguments": "",
                "status": "in_progress",
            }
        )

    def tool_delta(self, piece: str) -> Frames:
        item = self._item
        assert item is not None and item["type"] == "function_call"
        item["arguments"] += piece
        self._out_chars += len(piece)
        return [
            self._event(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": self._index,
                    "delta": piece,
                }
            )
        ]

    def finish(self, stop: Stop) -> Frames:
        frames = self._close()
        usage = self.responses_usage(
            tokens_for_chars(self._out_chars), tokens_for_chars(self._reasoning_chars)
        )
        kind = "response.incomplete" if stop == "length" else "response.completed"
        frames.append(
            self._event(
                {
                    "type": kind,
                    "response": self._response(self._status(stop), self._items, usage, stop),
                }
            )
        )
        return frames

    def ping(self) -> Frames:
        """Keepalive for ``pings``: the response's status event again (no output)."""
        return [
            self._event(
                {
                    "type": "response.in_progress",
                    "response": self._response("in_progress", [], None),
                }
            )
        ]

    def empty_delta(self) -> Frames:
        return self.text_delta("")

    def error_frame(self, error: dict[str, Any]) -> Frames:
        inner = dict(error.get("error") or {})
        failed = self._response("failed", self._items, None)
        failed["error"] = {
            "code": inner.get("code") or inner.get("type"),
            "message": inner.get("message", ""),
        }
        return [
            self._event({**inner, "type": "error", "code": inner.get("code") or inner.get("type")}),
            self._event({"type": "response.failed", "response": failed}),
        ]
