"""The one place API errors are rendered: ``{"code", "message", "data"}`` (API.md)."""

from __future__ import annotations

import logging
from typing import Any

import kombu.exceptions
import redis
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError as DatabaseInterfaceError
from django.db import OperationalError as DatabaseOperationalError
from django.http import Http404, HttpRequest, HttpResponse
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from agentops.exceptions import AgentopsError, RateLimited
from turns.dropin import wait_headers

logger = logging.getLogger(__name__)


def error_response(
    api: NinjaAPI,
    request: HttpRequest,
    status: int,
    code: str,
    message: str,
    data: dict[str, Any] | None = None,
) -> HttpResponse:
    data = dict(data or {})
    field = data.get("field")
    if status in (400, 422) and isinstance(field, str) and "errors" not in data:
        # API.md: every 400 and 422 lists its fields in data.errors, those checked by hand too.
        data["errors"] = [{"field": field, "message": message.removeprefix(f"{field}: ")}]
    return api.create_response(
        request, {"code": code, "message": message, "data": data}, status=status
    )


# A dependency that does not answer (PostgreSQL, Redis, the broker): the request may be tried
# again, so the client is told so (503 with Retry-After), not that the service has a bug (500).
UNAVAILABLE: tuple[type[Exception], ...] = (
    DatabaseOperationalError,
    DatabaseInterfaceError,
    redis.ConnectionError,
    redis.TimeoutError,
    kombu.exceptions.OperationalError,
)
RETRY_AFTER_S = 5


def unavailable_response(api: NinjaAPI, request: HttpRequest, exc: Exception) -> HttpResponse:
    what = (
        "the message broker"
        if isinstance(exc, kombu.exceptions.OperationalError)
        else ("Redis" if isinstance(exc, redis.RedisError) else "the database")
    )
    logger.warning(
        "%s %s: %s is unavailable (%s: %s)",
        request.method,
        request.path,
        what,
        type(exc).__name__,
        str(exc)[:200],
    )
    response = error_response(
        api,
        request,
        503,
        "unavailable",
        f"the service is temporarily unavailable ({what} does not answer); try again shortly",
        {"retry_after_s": RETRY_AFTER_S},
    )
    response["Retry-After"] = str(RETRY_AFTER_S)
    return response


_PYDANTIC_BRANCHES = {"str", "int", "float", "bool", "none", "dict", "list"}


def _field_path(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    # ninja prefixes the location with where the value came from and the parameter's name.
    if parts and parts[0] in ("body", "query", "path", "header", "form", "cookie"):
        parts = parts[1:]
        if parts and parts[0] in ("payload", "filters"):
            parts = parts[1:]
    path = ""
    for part in parts:
        if part.isdigit():
            path += f"[{part}]"
        elif "[" in part or part in _PYDANTIC_BRANCHES:
            continue  # pydantic's names for union branches, not fields
        else:
            path += ("." if path else "") + part
    return path or "body"


def _message(error: dict[str, Any]) -> str:
    """A pydantic error's message as a client reads it. A string checked by our validators
    (``agentops.validation``) has its length checked after them, as any value's, which pydantic
    words as a collection's ("Value should have at most 200 items"; a list's says "List"), and
    ninja drops the input that would tell a string apart: in our schemas only those strings
    are such values. A validator's own message needs no "Value error, " before it."""
    kind, ctx = error.get("type"), error.get("ctx") or {}
    if kind in ("too_long", "too_short") and ctx.get("field_type") == "Value":
        if kind == "too_long":
            return f"String should have at most {ctx.get('max_length')} characters"
        least = ctx.get("min_length")
        return f"String should have at least {least} character{'' if least == 1 else 's'}"
    message = str(error.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return message


def install(api: NinjaAPI) -> None:
    @api.exception_handler(AgentopsError)
    def _agentops(request: HttpRequest, exc: AgentopsError) -> HttpResponse:
        response = error_response(api, request, exc.status, exc.code, exc.message, exc.data)
        limit = exc.data.get("limit") if isinstance(exc, RateLimited) else None
        if isinstance(limit, str):
            # A project limit refused it (architecture.md §6.14): the headers a drop-in's
            # refusal carries, so one client reads both.
            wait = exc.data.get("retry_after_ms")
            if isinstance(wait, int | float):
                for name, value in wait_headers(wait).items():
                    response[name] = value
            response["x-should-retry"] = "true"
            response["x-agentops-limit"] = f"project {limit}"
        return response

    @api.exception_handler(ValidationError)
    def _validation(request: HttpRequest, exc: ValidationError) -> HttpResponse:
        errors = list(exc.errors)
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        field = _field_path(first.get("loc", ()))
        message = f"{field}: {_message(first)}"
        details = [
            {"field": _field_path(e.get("loc", ())), "message": _message(e)} for e in errors[:20]
        ]
        return error_response(
            api, request, 400, "bad_request", message, {"field": field, "errors": details}
        )

    @api.exception_handler(AuthenticationError)
    def _auth(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
        return error_response(
            api,
            request,
            401,
            "unauthorized",
            "a valid API token is required: Authorization: Bearer <token>",
        )

    @api.exception_handler(RequestDataTooBig)
    def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
        return error_response(
            api, request, 413, "payload_too_large", "body: the request body is too large"
        )

    @api.exception_handler(Http404)
    def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
        return error_response(api, request, 404, "not_found", str(exc) or "not found")

    @api.exception_handler(HttpError)
    def _http(request: HttpRequest, exc: HttpError) -> HttpResponse:
        if exc.status_code == 400 and "parse" in str(exc):
            # ninja's only 400 of its own: a body that is not JSON.
            return error_response(
                api, request, 400, "bad_request", "body: not valid JSON", {"field": "body"}
            )
        return error_response(api, request, exc.status_code, "error", str(exc))

    for unavailable in UNAVAILABLE:

        @api.exception_handler(unavailable)
        def _unavailable(request: HttpRequest, exc: Exception) -> HttpResponse:
            return unavailable_response(api, request, exc)

    @api.exception_handler(Exception)
    def _unexpected(request: HttpRequest, exc: Exception) -> HttpResponse:
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(
            api, request, 500, "internal", "an internal error occurred; it has been logged"
        )
