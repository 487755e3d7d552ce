"""What the two imitated wire formats share.

The formats themselves are :mod:`devtools.standin.openai_wire` (OpenAI chat
completions) and :mod:`devtools.standin.anthropic_wire` (Anthropic messages);
one wire object is made per request and builds that response's JSON bodies and
SSE frames.  This module holds what both formats and the scenario code use:
ids, JSON bytes, token estimates, text splitting, reading a request's messages
and tools, the provider-independent :class:`Reply`, retry hints, error messages
and thinking signatures.  It imports neither format module.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import json
import math
import secrets
import string
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

Stop = Literal["end", "tool", "length"]
Frames = list[bytes]
Headers = list[tuple[bytes, bytes]]

_ALPHANUM = string.ascii_letters + string.digits
KEEPALIVE_COMMENT = b": keepalive\n\n"


def random_id(prefix: str, length: int) -> str:
    return prefix + "".join(secrets.choice(_ALPHANUM) for _ in range(length))


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def estimate_tokens(text: str) -> int:
    return tokens_for_chars(len(text))


def tokens_for_chars(chars: int) -> int:
    """A rough token count: about four characters a token, 0 for nothing."""
    return (chars + 3) // 4


def split_text(text: str, pieces: int) -> list[str]:
    """Split ``text`` into at most ``pieces`` non-empty consecutive parts."""
    if not text:
        return []
    pieces = max(1, min(pieces, len(text)))
    size, extra = divmod(len(text), pieces)
    parts: list[str] = []
    pos = 0
    for i in range(pieces):
        end = pos + size + (1 if i < extra else 0)
        parts.append(text[pos:end])
        pos = end
    return parts


# --------------------------------------------------------------------------- #
# Reading requests
# --------------------------------------------------------------------------- #


def content_text(content: Any) -> str:
    """Text of an OpenAI or Anthropic message ``content`` (str or parts/blocks).

    Only text parts count (``tool_result`` blocks are skipped).
    """
    if isinstance(content, str):
        return content
    parts: list[str] = []
    if isinstance(content, list):
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") != "tool_result":
                text = block.get("text")
                if isinstance(text, str):
                    parts.append(text)
    return "\n".join(parts)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [m for m in messages if isinstance(m, dict)]


def last_user_text(body: dict[str, Any]) -> str:
    """The last text a user message holds ("" if none): what a model reads last and answers.
    Of a message with several text blocks (Anthropic merges consecutive user turns), its last."""
    for message in reversed(_messages(body)):
        if message.get("role") == "user":
            content = message.get("content")
            for block in reversed(content if isinstance(content, list) else [content]):
                text = content_text(block if isinstance(block, str) else [block])
                if text:
                    return text
    return ""


def last_tool_result(body: dict[str, Any]) -> str | None:
    """Content of the tool result(s) if the LAST message is one, else None.

    OpenAI: a ``tool`` (or legacy ``function``) role message.  Anthropic: a
    user message with ``tool_result`` blocks.
    """
    messages = _messages(body)
    if not messages:
        return None
    last = messages[-1]
    role = last.get("role")
    content = last.get("content")
    if role in ("tool", "function"):
        return content_text(content)
    if role == "user" and isinstance(content, list):
        results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        if results:
            return "\n".join(content_text(b.get("content")) for b in results)
    return None


def first_tool_name(body: dict[str, Any]) -> str | None:
    tools = body.get("tools")
    if not isinstance(tools, list):
        return None
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return str(function["name"])
        if isinstance(tool.get("name"), str):
            return str(tool["name"])
    return None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def contains_marker(body: dict[str, Any], marker: str) -> bool:
    """Whether any message (any string inside it, blocks included) or the
    Anthropic top-level ``system`` contains ``marker``."""
    candidates: list[Any] = [*_messages(body), body.get("system")]
    return any(marker in s for c in candidates for s in _strings(c))


def default_answer_text(body: dict[str, Any]) -> str:
    result = last_tool_result(body)
    if result is not None:
        return f"Tool result received: {result[:200]}"
    return f"Stand-in answer to: {last_user_text(body)[:200]}"


# --------------------------------------------------------------------------- #
# Replies and errors (provider independent)
# --------------------------------------------------------------------------- #


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class Reply:
    """A complete model reply, rendered by either wire."""

    text: str = ""
    text_chunks: int = 1
    thinking: str | None = None
    thinking_chunks: int = 1
    tool: ToolCall | None = None
    stop: Stop = "end"


def format_number(value: float) -> str:
    """``1000.0`` -> ``"1000"``, ``1.5`` -> ``"1.5"``, nan/inf -> ``"nan"``/``"inf"``."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == int(value):
        return str(int(value))
    return repr(value)


def json_number(value: float) -> int | float | str:
    """A JSON-safe number: non-finite values become the strings nan/inf/-inf."""
    if not math.isfinite(value):
        return format_number(value)
    return int(value) if value == int(value) else value


def http_date(wait_ms: float) -> str:
    if math.isnan(wait_ms):
        return "nan"
    if math.isinf(wait_ms):
        return "Fri, 31 Dec 9999 23:59:59 GMT" if wait_ms > 0 else "Thu, 01 Jan 1970 00:00:00 GMT"
    return email.utils.formatdate(max(0.0, time.time() + wait_ms / 1000.0), usegmt=True)


def retry_hints(form: str, wait_ms: float) -> tuple[Headers, dict[str, Any]]:
    """Response headers and extra error-object fields for an ``error`` form."""
    seconds = wait_ms / 1000.0
    if form == "retry-after-ms":
        return [(b"retry-after-ms", format_number(wait_ms).encode())], {}
    if form == "retry-after":
        return [(b"retry-after", format_number(seconds).encode())], {}
    if form == "retry-after-date":
        return [(b"retry-after", http_date(wait_ms).encode())], {}
    # The forms gateways and vendors use: LiteLLM's proxy passes a provider's wait on only in
    # llm_provider-retry-after(-ms); Azure OpenAI states it in x-ms-retry-after-ms.
    if form == "llm-provider-retry-after":
        return [(b"llm_provider-retry-after", format_number(seconds).encode())], {}
    if form == "llm-provider-retry-after-ms":
        return [(b"llm_provider-retry-after-ms", format_number(wait_ms).encode())], {}
    if form == "x-ms-retry-after-ms":
        return [(b"x-ms-retry-after-ms", format_number(wait_ms).encode())], {}
    if form == "body-ms":
        return [], {"retry_after_ms": json_number(wait_ms)}
    if form == "body-s":
        return [], {"retry_after": json_number(seconds)}
    if form == "body-retry-delay":
        info = {
            "@type": "type.googleapis.com/google.rpc.RetryInfo",
            "retryDelay": f"{format_number(seconds)}s",
        }
        return [], {"details": [info]}
    return [], {}


def default_error_message(status: int) -> str:
    if status == 429:
        return "Rate limit reached for requests (stand-in). Please try again later."
    if status == 529:
        return "Overloaded"
    if status == 401:
        return "Invalid authentication credentials (stand-in)."
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    return f"Stand-in error {status}: {phrase}"


def pad_message(message: str, size: int | None) -> str:
    if size is None or len(message) >= size:
        return message
    if size - len(message) == 1:
        return message + "."
    return message + " " + "x" * (size - len(message) - 1)


def signature(thinking: str) -> str:
    """A plausible-looking (opaque, base64) thinking signature."""
    digest = hashlib.sha256(thinking.encode()).digest() * 3
    return "Eq" + base64.b64encode(digest).decode()
