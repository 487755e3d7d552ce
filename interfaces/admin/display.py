"""How the admin shows instants and call errors (architecture.md §9): to the second, in UTC, with a
relative form (``3 min ago``); an error as its type, HTTP status, stated wait and message."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from agentops.wording import duration_text, excerpt, instant_text


def relative_text(value: datetime, *, now: datetime | None = None) -> str:
    """``3 min ago`` or ``in 2 h`` (``just now`` within a second)."""
    delta_ms = ((now or timezone.now()) - value).total_seconds() * 1000
    if abs(delta_ms) < 1000:
        return "just now"
    return f"{duration_text(delta_ms)} ago" if delta_ms > 0 else f"in {duration_text(-delta_ms)}"


def when(value: datetime | None) -> SafeString | str:
    """An instant for a list column or a page: ``2026-12-01 13:05:12 UTC (3 min ago)``."""
    if value is None:
        return "-"
    return format_html(
        '<span class="when" title="{}">{}</span> <span class="when-ago">({})</span>',
        value.isoformat(),
        instant_text(value),
        relative_text(value),
    )


def error_html(error: Any, *, message_limit: int = 300) -> SafeString | str:
    """A call's recorded error: type, HTTP status, the provider's stated wait, the message."""
    if not isinstance(error, dict) or not error:
        return "-"
    parts = [format_html("<strong>{}</strong>", error.get("type") or "error")]
    if error.get("http_status") is not None:
        parts.append(format_html("HTTP {}", error["http_status"]))
    if error.get("provider_code"):
        parts.append(format_html("<code>{}</code>", error["provider_code"]))
    wait = error.get("retry_after_ms")
    if error.get("until_released"):
        parts.append(mark_safe("asked to wait until released"))
    elif isinstance(wait, int | float):
        parts.append(format_html("asked to wait {}", duration_text(wait)))
    head = mark_safe(" · ".join(parts))
    message = str(error.get("message") or "")
    return format_html(
        '<div class="call-error">{}<br><span title="{}">{}</span></div>',
        head,
        message,
        excerpt(message, message_limit),
    )
