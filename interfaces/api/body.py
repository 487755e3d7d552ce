"""Reading a JSON body by hand, for the handlers that validate their body themselves (so a
wrongly typed field is a 400 naming it). The same limits as ninja's parsing: a body that is
not JSON, or nests deeper than ``JSON_DEPTH_LIMIT``, is a 400, never a RecursionError."""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime
from typing import Any

from django.http import HttpRequest

from agentops.exceptions import bad_field
from agentops.validation import instant_problem, json_loads, text_problem


def json_body(request: HttpRequest, *, shape: str, required: bool = True) -> dict[str, Any]:
    """The body as a JSON object (``{}`` for an empty optional body); ``shape`` names the
    fields for the error message."""
    raw = request.body
    if not raw and not required:
        return {}
    try:
        body = json_loads(raw or b"")
    except ValueError as exc:
        raise bad_field("body", str(exc)) from None
    if not isinstance(body, dict):
        raise bad_field("body", f"must be a JSON object {shape}")
    return body


def check_fields(body: dict[str, Any], known: Collection[str], *, shape: str) -> None:
    """A 400 naming the first field of ``body`` (sorted) not in ``known``: a misspelt field is
    refused, never ignored (a release without its ``model`` releases every model)."""
    unknown = sorted(set(body) - set(known))
    if unknown:
        raise bad_field(unknown[0], f"is not a field of {shape}")


def optional_line(body: dict[str, Any], field: str, *, limit: int) -> str | None:
    """``body[field]``: absent or null, or a one-line string within ``limit``, else a 400."""
    return _optional(body, field, limit=limit, line=True)


def optional_text(body: dict[str, Any], field: str, *, limit: int) -> str | None:
    """``body[field]``: absent or null, or text (newlines allowed) within ``limit``, else a 400."""
    return _optional(body, field, limit=limit, line=False)


def _optional(body: dict[str, Any], field: str, *, limit: int, line: bool) -> str | None:
    value = body.get(field)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_field(field, "must be a string")
    return checked_text(field, value, limit=limit, line=line)


def checked_text(field: str, value: str, *, limit: int, line: bool) -> str:
    """``value`` if it keeps the text rules (``line``: a line's) within ``limit`` characters,
    else a 400 naming ``field``. For a value checked by hand (a body's field, a query's)."""
    problem = text_problem(value, line=line)
    if problem:
        raise bad_field(field, problem)
    if len(value) > limit:
        raise bad_field(field, f"must be at most {limit} characters")
    return value


def check_instant(field: str, value: str | None) -> datetime | None:
    """``value`` as an instant in UTC (None when absent or empty): ISO 8601 with its UTC
    offset, within what ``instant_problem`` allows, else a 400 naming ``field``."""
    if not value:
        return None
    # Before parsing: Python's fromisoformat reads "…Z\x00" as the instant without its NUL.
    refused = text_problem(value, line=True)
    if refused:
        raise bad_field(field, refused)
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        raise bad_field(
            field, f"{value[:100]!r} is not an ISO 8601 instant (e.g. 2026-01-15T08:00:00Z)"
        ) from None
    if instant.tzinfo is None:
        raise bad_field(
            field, "must name its UTC offset (e.g. 2026-01-15T08:00:00Z): a local time is ambiguous"
        )
    problem = instant_problem(instant)
    if problem:
        raise bad_field(field, problem)
    return instant.astimezone(UTC)  # in range: no overflow; written back as API.md's UTC
