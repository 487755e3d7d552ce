"""Reading a JSON body by hand, for the handlers that validate their body themselves (so a
wrongly typed field is a 400 naming it). The same limits as ninja's parsing: a body that is
not JSON, or nests deeper than ``JSON_DEPTH_LIMIT``, is a 400, never a RecursionError."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest

from agentops.exceptions import bad_field
from agentops.validation import json_loads, text_problem


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
