"""Provider adapters: build a wire request, parse a body, and read a stream into Progress."""

from __future__ import annotations

import os

from agentops.models import Provider
from agentops.providers import key_env_problem
from calls.adapters.anthropic import AnthropicAdapter
from calls.adapters.base import Adapter, StreamReader, WireRequest
from calls.adapters.openai import OpenAIAdapter
from calls.adapters.responses import ResponsesAdapter
from calls.types import CompiledRequest


def build_wire(provider: Provider, request: CompiledRequest) -> tuple[Adapter, WireRequest]:
    """The provider's adapter and the wire request for ``request``, its key read from the
    environment variable the provider names (never stored)."""
    adapter = adapter_for(provider.kind)
    # Only a variable the operator allows is ever read (agentops.providers).
    allowed = provider.api_key_env and key_env_problem(provider.api_key_env) is None
    api_key = os.environ.get(provider.api_key_env, "") if allowed else ""
    return adapter, adapter.build(base_url=provider.base_url, api_key=api_key, request=request)


def adapter_for(kind: str) -> Adapter:
    if kind == "anthropic":
        return AnthropicAdapter()
    if kind == "openai-responses":
        return ResponsesAdapter()
    return OpenAIAdapter()


__all__ = [
    "Adapter",
    "AnthropicAdapter",
    "OpenAIAdapter",
    "ResponsesAdapter",
    "StreamReader",
    "WireRequest",
    "adapter_for",
    "build_wire",
]
