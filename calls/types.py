"""Plain values that travel between the compiler, the adapters, the reader and the policy."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from agentops.providers import secrets_redacted
from agentops.text import visible_controls

Role = Literal["user", "assistant"]


@dataclass
class Message:
    """One provider-neutral message: a role and blocks.

    Block shapes: {"type": "text", "text"}, {"type": "thinking", "thinking", "signature"?},
    {"type": "tool_call", "id", "name", "arguments": dict},
    {"type": "tool_result", "tool_call_id", "content": str}.
    """

    role: Role
    blocks: list[dict[str, Any]]


@dataclass
class CompiledRequest:
    model: str
    system: str
    messages: list[Message]
    max_tokens: int | None
    stream: bool
    thinking_budget: int | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class ProviderError:
    """A classified failure (architecture.md §5.6). Travels as a value, stored as ``as_dict()``."""

    type: str
    message: str
    http_status: int | None = None
    provider_code: str | None = None
    retryable: bool = False
    # None: no stated wait. float('inf') / nan: "until released" (kept as None + flag in JSON).
    retry_after_ms: float | None = None
    bound: str | None = None
    # A context-length refusal's stated window in tokens, when its message or body gives one.
    context_limit: int | None = None
    # Whom a rate limit or a spent credit binds (architecture.md §6.12): "agent", "model" (every
    # agent on the provider's model) or "provider" (the whole account); ``acceleration``: worded
    # as an acceleration limit (the seeds' cooldown).
    scope: str = "agent"
    acceleration: bool = False
    # A refusal of our own that lasts until an instant (a spent budget's reset, ms since the
    # epoch): carried as a value, not read back from the message.
    resets_at_ms: float | None = None
    # The project limit that refused the call before it was sent (architecture.md §6.14):
    # "requests_per_minute", "tokens_per_minute" or "concurrent_calls"; None for any other.
    limit: str | None = None

    def __post_init__(self) -> None:
        # The provider's words reach logs, alerts, notes, API answers and (in a note) another
        # provider: an ESC or a CR in them must show, not act (a colour, a rewritten log line),
        # and a key a provider or gateway echoed ("Bearer <key>") must not be there at all.
        self.message = visible_controls(secrets_redacted(self.message))
        if self.provider_code is not None:
            self.provider_code = visible_controls(secrets_redacted(self.provider_code))

    def as_dict(self) -> dict[str, Any]:
        wait = self.retry_after_ms
        finite = wait is not None and math.isfinite(wait)
        stated: dict[str, Any] = (
            {"context_limit": self.context_limit} if self.context_limit is not None else {}
        )
        if self.scope != "agent":
            stated["scope"] = self.scope
        if self.acceleration:
            stated["acceleration"] = True
        if self.resets_at_ms is not None:
            stated["resets_at_ms"] = self.resets_at_ms
        if self.limit is not None:
            stated["limit"] = self.limit
        return {
            **stated,
            "type": self.type,
            "http_status": self.http_status,
            "provider_code": self.provider_code,
            "message": self.message,
            "retryable": self.retryable,
            "retry_after_ms": wait if finite else None,
            # A stated wait that is not a finite number holds until released (architecture.md §6.2).
            "until_released": wait is not None and not finite,
        }


@dataclass(frozen=True)
class TokenUsage:
    """A call's token counts as the provider reported them; None: not reported (never 0)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    reasoning_tokens: int | None = None
    cached_input_tokens: int | None = None
    cache_write_tokens: int | None = None  # input written to the provider's cache

    def as_dict(self) -> dict[str, int | None]:
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "cache_write_tokens": self.cache_write_tokens,
        }


# A count past this is no count a model made (and past a bigint column's range): not reported.
TOKEN_COUNT_MAX = 2**63 - 1


def token_count(value: Any) -> int | None:
    """A reported token count: a non-negative integer a column holds, else None (not reported)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != value or value < 0 or value > TOKEN_COUNT_MAX:
        return None
    return int(value)


# The longest response model name kept (an attribute of the call's span, never stored).
RESPONSE_MODEL_LIMIT = 200


def response_model(value: Any) -> str:
    """A response's ``model`` as kept: a string, bounded; "" for anything else."""
    return value[:RESPONSE_MODEL_LIMIT] if isinstance(value, str) else ""


def token_detail(usage: Any, section: str, name: str) -> int | None:
    """``usage[section][name]`` as a token count (OpenAI's ``*_tokens_details``)."""
    details = usage.get(section) if isinstance(usage, dict) else None
    return token_count(details.get(name)) if isinstance(details, dict) else None


@dataclass
class CallOutput:
    """What a completed call produced, in provider-neutral blocks."""

    blocks: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    # The model the provider says answered (its response's ``model``), bounded; "" when unsaid.
    model: str = ""

    @property
    def text(self) -> str:
        return "".join(b["text"] for b in self.blocks if b["type"] == "text")

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return [b for b in self.blocks if b["type"] == "tool_call"]


@dataclass
class Progress:
    """One parsed wire event, as the reader counts it (architecture.md §5.2)."""

    model_event: bool
    content: bool = False
    thinking_start: bool = False
    text_delta: str = ""
    error: ProviderError | None = None
    done: bool = False
