"""Anthropic messages wire format."""

from __future__ import annotations

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
)

ANTHROPIC_VERSION = "2023-06-01"
# The messages API requires max_tokens; this is used when the agent sets none.
DEFAULT_MAX_TOKENS = 4096


def _block_to_wire(block: dict[str, Any]) -> dict[str, Any] | None:
    kind = block["type"]
    if kind == "text":
        return {"type": "text", "text": block["text"]}
    if kind == "thinking":
        if not block.get("signature"):
            return None  # unsigned thinking cannot be sent back
        return {"type": "thinking", "thinking": block["thinking"], "signature": block["signature"]}
    if kind == "tool_call":
        return {
            "type": "tool_use",
            "id": block["id"],
            "name": block["name"],
            "input": block["arguments"],
        }
    if kind == "tool_result":
        return {
            "type": "tool_result",
            "tool_use_id": block["tool_call_id"],
            "content": block["content"],
        }
    return None


class AnthropicAdapter:
    def build(self, *, base_url: str, api_key: str, request: CompiledRequest) -> WireRequest:
        messages: list[dict[str, Any]] = []
        for message in request.messages:
            blocks = [w for b in message.blocks if (w := _block_to_wire(b)) is not None]
            if not blocks:
                continue
            # Tool results must come first in a user turn; consecutive same-role turns merge.
            if messages and messages[-1]["role"] == message.role:
                messages[-1]["content"].extend(blocks)
            else:
                messages.append({"role": message.role, "content": blocks})
        for entry in messages:
            entry["content"].sort(key=lambda b: 0 if b["type"] == "tool_result" else 1)
        body: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens or DEFAULT_MAX_TOKENS,
            "messages": messages,
            "stream": request.stream,
        }
        if request.system:
            body["system"] = request.system
        if request.thinking_budget:
            body["thinking"] = {"type": "enabled", "budget_tokens": request.thinking_budget}
        if request.tools:
            body["tools"] = [
                {
                    "name": t["name"],
                    "description": t.get("description", ""),
                    "input_schema": t.get("input_schema") or {"type": "object", "properties": {}},
                }
                for t in request.tools
            ]
        headers = {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return WireRequest(url=base_url.rstrip("/") + "/v1/messages", headers=headers, body=body)

    def parse_body(self, data: Any) -> CallOutput:
        blocks: list[dict[str, Any]] = []
        for block in data.get("content") or []:
            kind = block.get("type")
            if kind == "text" and block.get("text"):
                blocks.append({"type": "text", "text": block["text"]})
            elif kind == "thinking":
                blocks.append(
                    {
                        "type": "thinking",
                        "thinking": block.get("thinking", ""),
                        "signature": block.get("signature", ""),
                    }
                )
            elif kind == "tool_use":
                blocks.append(
                    {
                        "type": "tool_call",
                        "id": block.get("id", ""),
                        "name": block.get("name", ""),
                        "arguments": block.get("input") or {},
                    }
                )
        return CallOutput(
            blocks=blocks,
            stop_reason=data.get("stop_reason") or "",
            usage=data.get("usage") or {},
            model=response_model(data.get("model")),
        )

    def reader(self) -> AnthropicStreamReader:
        return AnthropicStreamReader()

    def usage(self, raw: dict[str, Any]) -> TokenUsage:
        # Anthropic's input_tokens leaves out the cache reads and writes: the input is the sum,
        # as OpenAI counts it. Thinking is billed as output and not reported apart.
        plain = token_count(raw.get("input_tokens"))
        read = token_count(raw.get("cache_read_input_tokens"))
        written = token_count(raw.get("cache_creation_input_tokens"))
        return TokenUsage(
            input_tokens=None if plain is None else plain + (read or 0) + (written or 0),
            output_tokens=token_count(raw.get("output_tokens")),
            reasoning_tokens=None,
            cached_input_tokens=read,
            cache_write_tokens=written,
        )


class AnthropicStreamReader:
    def __init__(self) -> None:
        self.answer_size = 0
        self._blocks: dict[int, dict[str, Any]] = {}
        self._stop = ""
        self._usage: dict[str, Any] = {}
        self._model = ""

    def feed(self, event: SseEvent, now_ms: float) -> list[Progress]:
        data = event_object(event)
        if data is None:
            return [Progress(model_event=False)]
        kind = data.get("type") or event.event
        if kind == "error":
            return [Progress(model_event=False, error=classify_frame(data, now_ms), done=True)]
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            index = data.get("index", len(self._blocks))
            btype = block.get("type")
            if btype in ("thinking", "redacted_thinking"):
                self._blocks[index] = {
                    "type": "thinking",
                    "thinking": block.get("thinking", ""),
                    "signature": block.get("signature", ""),
                }
                return [Progress(model_event=True, thinking_start=True)]
            if btype == "tool_use":
                self._blocks[index] = {
                    "type": "tool_call",
                    "id": block.get("id", ""),
                    "name": block.get("name", ""),
                    "_json": "",
                }
                return [Progress(model_event=True, content=True)]
            self._blocks[index] = {"type": "text", "text": block.get("text", "")}
            # An empty text block's start is a block start: a model event, not yet content.
            return [Progress(model_event=True, content=bool(block.get("text")))]
        if kind == "content_block_delta":
            delta = data.get("delta") or {}
            slot = self._blocks.get(data.get("index", 0))
            dtype = delta.get("type")
            if dtype == "text_delta":
                text = delta.get("text", "")
                if not text:
                    return [Progress(model_event=False)]
                if slot is not None:
                    slot["text"] = slot.get("text", "") + text
                self.answer_size += utf8_size(text)
                return [Progress(model_event=True, content=True, text_delta=text)]
            if dtype == "thinking_delta":
                text = delta.get("thinking", "")
                if not text:
                    return [Progress(model_event=False)]
                if slot is not None:
                    slot["thinking"] = slot.get("thinking", "") + text
                self.answer_size += utf8_size(text)
                return [Progress(model_event=True)]
            if dtype == "signature_delta":
                if slot is not None:
                    slot["signature"] = slot.get("signature", "") + delta.get("signature", "")
                return [Progress(model_event=bool(delta.get("signature")))]
            if dtype == "input_json_delta":
                part = delta.get("partial_json", "")
                if not part:
                    return [Progress(model_event=False)]
                if slot is not None:
                    slot["_json"] = slot.get("_json", "") + part
                self.answer_size += utf8_size(part)
                return [Progress(model_event=True, content=True)]
            return [Progress(model_event=False)]
        if kind == "content_block_stop":
            slot = self._blocks.get(data.get("index", 0))
            is_content = slot is not None and (
                slot["type"] == "tool_call" or bool(slot.get("text"))
            )
            return [Progress(model_event=True, content=is_content)]
        if kind == "message_delta":
            self._stop = (data.get("delta") or {}).get("stop_reason") or self._stop
            self._usage.update(data.get("usage") or {})
            return [Progress(model_event=False)]
        if kind == "message_stop":
            return [Progress(model_event=True, done=True)]
        if kind == "message_start":
            message = data.get("message") or {}
            self._usage.update(message.get("usage") or {})
            self._model = response_model(message.get("model"))
        # message_start, ping and anything unknown are keepalives.
        return [Progress(model_event=False)]

    def output(self) -> CallOutput:
        blocks: list[dict[str, Any]] = []
        for _, block in sorted(self._blocks.items()):
            if block["type"] == "tool_call":
                blocks.append(
                    {
                        "type": "tool_call",
                        "id": block["id"],
                        "name": block["name"],
                        "arguments": parse_arguments(block.get("_json", "")),
                    }
                )
            elif block["type"] == "text":
                if block.get("text"):
                    blocks.append({"type": "text", "text": block["text"]})
            else:
                blocks.append(block)
        return CallOutput(
            blocks=blocks, stop_reason=self._stop, usage=self._usage, model=self._model
        )
