"""Provider adapters: build a wire request, parse a body, and read a stream into Progress."""

from __future__ import annotations

from .anthropic import AnthropicAdapter
from .base import Adapter, StreamReader, WireRequest
from .openai import OpenAIAdapter


def adapter_for(kind: str) -> Adapter:
    if kind == "anthropic":
        return AnthropicAdapter()
    return OpenAIAdapter()


__all__ = ["Adapter", "AnthropicAdapter", "OpenAIAdapter", "StreamReader", "WireRequest", "adapter_for"]
