"""Provider adapters: build a wire request, parse a body, and read a stream into Progress."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import replace

import httpx

from agentops.models import Provider
from agentops.providers import key_env_problem
from agentops.urlsafety import IPAddress

from ..types import CompiledRequest
from .anthropic import AnthropicAdapter
from .base import Adapter, StreamReader, WireRequest
from .openai import OpenAIAdapter
from .responses import ResponsesAdapter


def build_wire(provider: Provider, request: CompiledRequest) -> tuple[Adapter, WireRequest]:
    """The provider's adapter and the wire request for ``request``, its key read from the
    environment variable the provider names (never stored)."""
    adapter = adapter_for(provider.kind)
    # Only a variable the operator allows is ever read (agentops.providers).
    allowed = provider.api_key_env and key_env_problem(provider.api_key_env) is None
    api_key = os.environ.get(provider.api_key_env, "") if allowed else ""
    return adapter, adapter.build(base_url=provider.base_url, api_key=api_key, request=request)


def wire_pinned(wire: WireRequest, address: IPAddress) -> WireRequest:
    """``wire`` sent to ``address`` (what the provider's host resolved to when it was checked),
    so the connection goes where the check looked: the name goes in the Host header and, over
    https, in TLS SNI, and the certificate is verified against it."""
    target = httpx.URL(wire.url)
    try:
        ipaddress.ip_address(target.host)
        return wire  # already an address
    except ValueError:
        pass
    return replace(
        wire,
        url=str(target.copy_with(host=str(address))),
        headers={**wire.headers, "host": target.netloc.decode("ascii")},
        sni_hostname=target.raw_host.decode("ascii"),
    )


def adapter_for(kind: str) -> Adapter:
    if kind == "anthropic":
        return AnthropicAdapter()
    if kind == "openai-responses":
        return ResponsesAdapter()
    return OpenAIAdapter()


__all__ = ["Adapter", "AnthropicAdapter", "OpenAIAdapter", "ResponsesAdapter", "StreamReader", "WireRequest", "adapter_for", "build_wire", "wire_pinned"]
