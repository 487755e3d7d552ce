"""The wire formats the drop-in endpoints speak (architecture.md §14): which provider kind each serves,
its error shape (so the official SDKs raise their usual exceptions), and SSE events as text."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django.http import HttpResponse, JsonResponse

from calls.sse import SseEvent


@dataclass(frozen=True)
class Format:
    kind: str  # the provider kind whose agents this endpoint serves
    path: str
    label: str

    def error_body(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        extra: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The format's own error object for ``status``."""
        if self.kind == "anthropic":
            return {
                "type": "error",
                "error": {
                    "type": code
                    or ANTHROPIC_TYPES.get(
                        status, "api_error" if status >= 500 else "invalid_request_error"
                    ),
                    "message": message,
                    **(extra or {}),
                },
            }
        etype, default_code = OPENAI_TYPES.get(
            status, ("server_error" if status >= 500 else "invalid_request_error", None)
        )
        return {
            "error": {
                "message": message,
                "type": etype,
                "param": None,
                "code": code or default_code,
                **(extra or {}),
            }
        }

    def keepalive(self) -> bytes:
        """What keeps a quiet stream's client alive: Anthropic's ``ping`` event, else an SSE
        comment; every SDK reads past both."""
        if self.kind == "anthropic":
            return sse_bytes(SseEvent("ping", '{"type": "ping"}'))
        return b": keepalive\n\n"

    def stream_error(self, message: str, *, code: str) -> bytes:
        """An error event that ends a stream, as the format's SDK reads one."""
        if self.kind == "anthropic":
            return sse_bytes(
                SseEvent(
                    "error",
                    json.dumps(
                        {
                            "type": "error",
                            "error": {
                                "type": "timeout_error" if code in TIMEOUT_CODES else "api_error",
                                "message": message,
                            },
                        }
                    ),
                )
            )
        if self.kind == "openai-responses":
            return sse_bytes(
                SseEvent(
                    "error",
                    json.dumps({"type": "error", "code": code, "message": message, "param": None}),
                )
            )
        return sse_bytes(
            SseEvent(
                "message",
                json.dumps(
                    {
                        "error": {
                            "message": message,
                            "type": "timeout" if code in TIMEOUT_CODES else "server_error",
                            "param": None,
                            "code": code,
                        }
                    }
                ),
            )
        )


# The bounds a cut names (its error's code), as calls.bounds.Bound values.
TIMEOUT_CODES = frozenset({"before_content", "between_events", "flat", "absolute", "whole_call"})
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    503: "api_error",
    504: "timeout_error",
}
OPENAI_TYPES: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", None),
    404: ("invalid_request_error", "model_not_found"),
    405: ("invalid_request_error", None),
    413: ("invalid_request_error", None),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    502: ("server_error", None),
    503: ("server_error", None),
    504: ("timeout", None),
}

OPENAI = Format(kind="openai", path="/v1/chat/completions", label="OpenAI chat completions")
ANTHROPIC = Format(kind="anthropic", path="/v1/messages", label="Anthropic messages")
RESPONSES = Format(kind="openai-responses", path="/v1/responses", label="OpenAI Responses")
FORMATS = {f.kind: f for f in (OPENAI, ANTHROPIC, RESPONSES)}


def sse_bytes(event: SseEvent) -> bytes:
    """One SSE event (or comment) as it goes on the wire."""
    if event.comment:
        return f": {event.data}\n\n".encode() if event.data else b":\n\n"
    head = f"event: {event.event}\n" if event.event and event.event != "message" else ""
    data = "".join(f"data: {line}\n" for line in event.data.split("\n"))
    return (head + data + "\n").encode()


def error(
    fmt: Format,
    status: int,
    message: str,
    *,
    code: str | None = None,
    extra: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> HttpResponse:
    """An error response in ``fmt``'s shape."""
    return JsonResponse(
        fmt.error_body(status, message, code=code, extra=extra), status=status, headers=headers
    )
