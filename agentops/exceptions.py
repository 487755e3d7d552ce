"""The one error hierarchy. The API renders these in one place (interfaces.api.errors)."""

from __future__ import annotations

from typing import Any


class AgentopsError(Exception):
    """Base of every error the service raises on purpose. ``status`` is the HTTP status."""

    code = "error"
    status = 400

    def __init__(self, message: str, *, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data = data or {}


class BadRequest(AgentopsError):
    """A malformed value. The message names the field."""

    code = "bad_request"
    status = 400


class Unauthorized(AgentopsError):
    code = "unauthorized"
    status = 401


class Forbidden(AgentopsError):
    code = "forbidden"
    status = 403


class NotFound(AgentopsError):
    code = "not_found"
    status = 404


class Conflict(AgentopsError):
    """The request is well-formed but the target's state does not allow it."""

    code = "conflict"
    status = 409


class Unprocessable(AgentopsError):
    """Well-formed, but not what an earlier request under the same key sent."""

    code = "unprocessable"
    status = 422


class PayloadTooLarge(AgentopsError):
    code = "payload_too_large"
    status = 413


class RateLimited(AgentopsError):
    code = "rate_limit"
    status = 429


class ProviderFailed(AgentopsError):
    """An auxiliary call failed at the provider; ``data`` carries the classified error."""

    code = "provider_error"
    status = 502


class CallTimedOut(AgentopsError):
    code = "timeout"
    status = 504


def bad_field(field: str, problem: str) -> BadRequest:
    return BadRequest(f"{field}: {problem}", data={"field": field})
