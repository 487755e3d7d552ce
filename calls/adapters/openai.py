"""OpenAI chat-completions compatible wire format."""

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

_FINISH = {
    "stop": "end_turn",
    "tool_calls": "tool_use",
    "length": "max_tokens",
    "function_call": "tool_use",
}


class OpenAIAdapter:
    def build(self, *, base_url: str, api_key: str, request: CompiledRequest) -> WireRequest:
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        for message in request.messages:
            texts = [b["text"] for b in message.blocks if b["type"] == "text"]
            calls = [b for b in message.blocks if b["type"] == "tool_call"]
            results = [b for b in message.blocks if b["type"] == "tool_result"]
            for result in results:
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": result["tool_call_id"],
                        "content": result["content"],
                    }
                )
            if message.role == "assistant":
                entry: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) or None}
                if calls:
                    entry["tool_calls"] = [
                        {
                            "id": c["id"],
                            "type": "function",
                            "function": {
                                "name": c["name"],
                                "arguments": json.dumps(c["arguments"]),
                            },
                        }
                        for c in calls
                    ]
                messages.append(entry)
            elif texts:
                messages.append({"role": "user", "content": "\n".join(texts)})
        body: dict[str, Any] = {
            "model": request.model,
            "messages": messages,
            "stream": request.stream,
        }
        if request.max_tokens:
            body["max_tokens"] = request.max_tokens
        if request.stream:
            body["stream_options"] = {"include_usage": True}
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t["name"],
                        "description": t.get("description", ""),
                        "parameters": t.get("input_schema") or {"type": "object", "properties": {}},
                    },
                }
                for t in request.tools
            ]
        headers = {
            "content-type": "application/json",
            "accept": "text/event-stream" if request.stream else "application/json",
        }
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        return WireRequest(
            url=base_url.rstrip("/") + "/chat/completions", headers=headers, body=body
        )

    def parse_body(self, data: Any) -> CallOutput:
        choice = (data.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        blocks: list[dict[str, Any]] = []
        thinking = message.get("reasoning_content") or message.get("reasoning")
        if thinking:
            blocks.append({"type": "thinking", "thinking": thinking})
        if message.get("content"):
            blocks.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or []:
            fn = call.get("function") or {}
            blocks.append(
                {
                    "type": "tool_call",
                    "id": call.get("id", ""),
                    "name": fn.get("name", ""),
                    "arguments": parse_arguments(fn.get("arguments") or ""),
                }
            )
        finish = choice.get("finish_reason") or ""
        return CallOutput(
            blocks=blocks,
            stop_reason=_FINISH.get(finish, finish),
            usage=data.get("usage") or {},
            model=response_model(data.get("model")),
        )

    def reader(self) -> OpenAIStreamReader:
        return OpenAIStreamReader()

    def usage(self, raw: dict[str, Any]) -> TokenUsage:
        # prompt_tokens counts the cached ones too; completion_tokens the reasoning ones.
        return TokenUsage(
            input_tokens=token_count(raw.get("prompt_tokens")),
            output_tokens=token_count(raw.get("completion_tokens")),
            reasoning_tokens=token_detail(raw, "completion_tokens_details", "reasoning_tokens"),
            cached_input_tokens=token_detail(raw, "prompt_tokens_details", "cached_tokens"),
        )


class OpenAIStreamReader:
    def __init__(self) -> None:
        self.answer_size = 0
        self._thinking = ""
        self._text = ""
        self._calls: dict[int, dict[str, Any]] = {}
        self._finish = ""
        self._usage: dict[str, Any] = {}
        self._in_thinking = False
        self._thinking_started = False
        self._model: str | None = None  # the first chunk's model: each chunk repeats it

    def feed(self, event: SseEvent, now_ms: float) -> list[Progress]:
        if not event.comment and event.data.strip() == "[DONE]":
            return [Progress(model_event=False, done=True)]
        chunk = event_object(event)
        if chunk is None:
            return [Progress(model_event=False)]
        if "error" in chunk:
            return [Progress(model_event=False, error=classify_frame(chunk, now_ms), done=True)]
        if self._model is None:
            self._model = response_model(chunk.get("model"))
        if chunk.get("usage"):
            self._usage = chunk["usage"]
        items: list[Progress] = []
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content", delta.get("reasoning"))
            if isinstance(reasoning, str) and (reasoning or not self._thinking_started):
                # OpenAI-compatible servers have no block-start event: the first reasoning
                # delta, even an empty one, is the thinking block's start.
                start = not self._thinking_started
                self._thinking_started = self._in_thinking = True
                self._thinking += reasoning
                self.answer_size += utf8_size(reasoning)
                items.append(Progress(model_event=True, thinking_start=start))
            text = delta.get("content")
            if text:
                self._in_thinking = False
                self._text += text
                self.answer_size += utf8_size(text)
                items.append(Progress(model_event=True, content=True, text_delta=text))
            for call in delta.get("tool_calls") or []:
                self._in_thinking = False
                index = call.get("index", 0)
                slot = self._calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                fn = call.get("function") or {}
                if call.get("id"):
                    slot["id"] = call["id"]
                if fn.get("name"):
                    slot["name"] += fn["name"]
                if fn.get("arguments"):
                    slot["arguments"] += fn["arguments"]
                    self.answer_size += utf8_size(fn["arguments"])
                if call.get("id") or fn.get("name") or fn.get("arguments"):
                    items.append(Progress(model_event=True, content=True))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
                items.append(Progress(model_event=True))
        return items or [Progress(model_event=False)]

    def output(self) -> CallOutput:
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
        return CallOutput(
            blocks=blocks,
            stop_reason=_FINISH.get(self._finish, self._finish),
            usage=self._usage,
            model=self._model or "",
        )
