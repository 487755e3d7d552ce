"""The OpenAI Responses API wire format (provider kind ``openai-responses``): ``POST
{base}/responses``, streamed and not.

Reading a stream (architecture.md §5.2): a ``reasoning`` output item's start is a thinking block's
start, and reasoning summary / reasoning text deltas are thinking model events (the thinking
allowance of §5.3 applies); output text deltas, a function call's start and its argument
deltas are content; the other output-item and part events are model events; ``response.created``
and ``response.in_progress`` are keepalives (the response's status, no output);
``response.completed`` (or ``response.incomplete``) is the stop. ``error`` and
``response.failed`` are classified as §5.6.
"""

from __future__ import annotations

import json
from typing import Any

from calls.adapters.base import WireRequest, event_object, parse_arguments, utf8_size
from calls.classify import classify_frame
from calls.sse import SseEvent
from calls.types import (
    CallOutput,
    CompiledRequest,
    Progress,
    TokenUsage,
    response_model,
    token_count,
    token_detail,
)

_THINKING_DELTAS = frozenset(
    {"response.reasoning_summary_text.delta", "response.reasoning_text.delta"}
)
_MODEL_EVENTS = frozenset(
    {
        "response.output_item.done",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.done",
        "response.function_call_arguments.done",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_part.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_text.done",
        "response.refusal.done",
    }
)


def _input_items(request: CompiledRequest) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for message in request.messages:
        texts = [b["text"] for b in message.blocks if b["type"] == "text"]
        for block in message.blocks:
            if block["type"] == "tool_result":
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": block["tool_call_id"],
                        "output": block["content"],
                    }
                )
        if texts:
            items.append({"role": message.role, "content": "\n".join(texts)})
        for block in message.blocks:
            if block["type"] == "tool_call":
                items.append(
                    {
                        "type": "function_call",
                        "call_id": block["id"],
                        "name": block["name"],
                        "arguments": json.dumps(block["arguments"]),
                    }
                )
    return items


def _stop_reason(response: dict[str, Any], output: list[dict[str, Any]]) -> str:
    if response.get("status") == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason") or ""
        return "max_tokens" if reason == "max_output_tokens" else reason or "incomplete"
    if any(item.get("type") == "function_call" for item in output):
        return "tool_use"
    return "end_turn"


def _output_blocks(output: list[Any]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for item in output:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "reasoning":
            parts = [
                p.get("text", "")
                for p in (item.get("summary") or []) + (item.get("content") or [])
                if isinstance(p, dict)
            ]
            text = "".join(parts)
            if text:
                blocks.append({"type": "thinking", "thinking": text})
        elif kind == "message":
            text = "".join(
                p.get("text", "")
                for p in item.get("content") or []
                if isinstance(p, dict) and p.get("type") == "output_text"
            )
            if text:
                blocks.append({"type": "text", "text": text})
        elif kind == "function_call":
            blocks.append(
                {
                    "type": "tool_call",
                    "id": item.get("call_id") or item.get("id", ""),
                    "name": item.get("name", ""),
                    "arguments": parse_arguments(item.get("arguments") or ""),
                }
            )
    return blocks


class ResponsesAdapter:
    def build(self, *, base_url: str, api_key: str, request: CompiledRequest) -> WireRequest:
        body: dict[str, Any] = {
            "model": request.model,
            "input": _input_items(request),
            "stream": request.stream,
            "store": False,
        }
        if request.system:
            body["instructions"] = request.system
        if request.max_tokens:
            body["max_output_tokens"] = request.max_tokens
        if request.thinking_budget:
            body["reasoning"] = {"summary": "auto"}
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema") or {"type": "object", "properties": {}},
                }
                for t in request.tools
            ]
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if request.stream else "application/json",
        }
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        return WireRequest(url=base_url.rstrip("/") + "/responses", headers=headers, body=body)

    def parse_body(self, data: Any) -> CallOutput:
        output = data.get("output") or []
        return CallOutput(
            blocks=_output_blocks(output),
            stop_reason=_stop_reason(data, output),
            usage=data.get("usage") or {},
            model=response_model(data.get("model")),
        )

    def reader(self) -> ResponsesStreamReader:
        return ResponsesStreamReader()

    def usage(self, raw: dict[str, Any]) -> TokenUsage:
        return TokenUsage(
            input_tokens=token_count(raw.get("input_tokens")),
            output_tokens=token_count(raw.get("output_tokens")),
            reasoning_tokens=token_detail(raw, "output_tokens_details", "reasoning_tokens"),
            cached_input_tokens=token_detail(raw, "input_tokens_details", "cached_tokens"),
        )


class ResponsesStreamReader:
    def __init__(self) -> None:
        self.answer_size = 0
        self._output: CallOutput | None = None
        self._thinking = ""
        self._text = ""
        self._calls: dict[int, dict[str, Any]] = {}
        self._model = ""

    def feed(self, event: SseEvent, now_ms: float) -> list[Progress]:
        data = event_object(event)
        if data is None:
            return [Progress(model_event=False)]
        kind = data.get("type") or event.event
        if kind == "error":
            return [Progress(model_event=False, error=classify_frame(data, now_ms), done=True)]
        if kind == "response.failed":
            response = data.get("response") or {}
            failure = response.get("error") if isinstance(response, dict) else None
            return [
                Progress(
                    model_event=False,
                    error=classify_frame(
                        {"error": failure or {"message": "the response failed"}}, now_ms
                    ),
                    done=True,
                )
            ]
        if kind in ("response.completed", "response.incomplete"):
            response = data.get("response") or {}
            output = response.get("output") or []
            blocks = _output_blocks(output) if output else self._streamed_blocks()
            self._output = CallOutput(
                blocks=blocks,
                stop_reason=_stop_reason(response, output or self._streamed_items()),
                usage=response.get("usage") or {},
                model=response_model(response.get("model")) or self._model,
            )
            return [Progress(model_event=True, done=True)]
        if kind == "response.output_item.added":
            item = data.get("item") or {}
            itype = item.get("type")
            if itype == "reasoning":
                return [Progress(model_event=True, thinking_start=True)]
            if itype == "function_call":
                self._calls[data.get("output_index", len(self._calls))] = {
                    "id": item.get("call_id") or item.get("id", ""),
                    "name": item.get("name", ""),
                    "arguments": item.get("arguments") or "",
                }
                return [Progress(model_event=True, content=True)]
            return [Progress(model_event=True)]
        if kind in _THINKING_DELTAS:
            delta = data.get("delta") or ""
            if not delta:
                return [Progress(model_event=False)]
            self._thinking += delta
            self.answer_size += utf8_size(delta)
            return [Progress(model_event=True)]
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            delta = data.get("delta") or ""
            if not delta:
                return [Progress(model_event=False)]
            self._text += delta
            self.answer_size += utf8_size(delta)
            return [Progress(model_event=True, content=True, text_delta=delta)]
        if kind == "response.function_call_arguments.delta":
            delta = data.get("delta") or ""
            if not delta:
                return [Progress(model_event=False)]
            slot = self._calls.setdefault(
                data.get("output_index", 0),
                {"id": data.get("item_id", ""), "name": "", "arguments": ""},
            )
            slot["arguments"] += delta
            self.answer_size += utf8_size(delta)
            return [Progress(model_event=True, content=True)]
        if kind in _MODEL_EVENTS:
            return [Progress(model_event=True)]
        if kind == "response.created":
            self._model = response_model((data.get("response") or {}).get("model"))
        # response.created, response.in_progress and anything unknown are keepalives.
        return [Progress(model_event=False)]

    def _streamed_items(self) -> list[dict[str, Any]]:
        return [{"type": "function_call"} for _ in self._calls]

    def _streamed_blocks(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = []
        if self._thinking:
            blocks.append({"type": "thinking", "thinking": self._thinking})
        if self._text:
            blocks.append({"type": "text", "text": self._text})
        for _, call in sorted(self._calls.items()):
            blocks.append(
                {
                    "type": "tool_call",
                    "id": call["id"],
                    "name": call["name"],
                    "arguments": parse_arguments(call["arguments"]),
                }
            )
        return blocks

    def output(self) -> CallOutput:
        if self._output is not None:
            return self._output
        # The stream ended without its stop: what arrived, with no stop reason (incomplete).
        return CallOutput(
            blocks=self._streamed_blocks(), stop_reason="", usage={}, model=self._model
        )
