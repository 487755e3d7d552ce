from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from agentops.text import untrusted_json
from agentops.urlsafety import IPAddress
from calls.sse import SseEvent
from calls.types import CallOutput, CompiledRequest, Progress, TokenUsage


@dataclass
class WireRequest:
    url: str
    headers: dict[str, str]
    body: dict[str, Any]
    # What the URL's host resolved to when the provider policy checked it: the only addresses
    # the call connects to (None: the URL names an address, or nothing was checked).
    addresses: tuple[IPAddress, ...] | None = field(default=None)


class StreamReader(Protocol):
    # The UTF-8 bytes of text, thinking and tool-call arguments read so far (``utf8_size``):
    # the call's reading stops once it passes AGENTOPS_PROVIDER_MAX_ANSWER_BYTES (§15).
    answer_size: int

    def feed(self, event: SseEvent, now_ms: float) -> list[Progress]:
        """Parse one SSE event (or comment) into progress items; always at least one."""

    def output(self) -> CallOutput: ...


class Adapter(Protocol):
    def build(self, *, base_url: str, api_key: str, request: CompiledRequest) -> WireRequest: ...

    def parse_body(self, data: Any) -> CallOutput: ...

    def reader(self) -> StreamReader: ...

    def usage(self, raw: dict[str, Any]) -> TokenUsage:
        """The wire format's usage object (a body's, or what a stream reported) as counts."""


def utf8_size(text: str) -> int:
    """``text``'s size in UTF-8, without encoding it when it is ASCII (a flag, not a scan)."""
    return len(text) if text.isascii() else len(text.encode())


def event_object(event: SseEvent) -> dict[str, Any] | None:
    """An SSE event's JSON object, or None for a keepalive: a comment, an empty event, data
    that is not JSON or not an object (none of them a model event)."""
    if event.comment or not event.data.strip():
        return None
    try:
        value = untrusted_json(event.data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def parse_arguments(text: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = untrusted_json(text)
    except ValueError:
        return {"_raw": text}
    return value if isinstance(value, dict) else {"_value": value}
