"""The one check of client text, applied once at the edge (API schemas, path and query
parameters, the release service): what cannot be stored, or would mislead a reader, is refused
with a 400 naming the field before anything changes.

Every string: no NUL (PostgreSQL cannot store it), no lone surrogate (it cannot be encoded as
UTF-8, so it cannot be stored or sent), no C0 control other than tab, newline and carriage
return, no DEL, no C1 control (U+0080-U+009F). A *line* (a name, a participant, a label, a
model) is stricter: no tab or newline either, no bidi embedding/override/isolate controls
(they make a name read differently from what it is) and no line or paragraph separator
(U+2028, U+2029), since lines are written into prompts, logs and the admin.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Annotated, Any, Final

from pydantic import AfterValidator, Field

# Bidi embeddings, overrides and isolates, and the marks (U+200E, U+200F, U+061C).
BIDI_CONTROLS: Final = frozenset(
    "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
)
LINE_SEPARATORS: Final = frozenset("\u2028\u2029")
JSON_DEPTH_LIMIT: Final = 32  # nesting levels of a request body (and of a tool's input_schema)
# A body passed on to a provider as it is (the drop-in endpoints): a client's tool schemas nest
# two levels per object, and the body is parsed and written again well within Python's stack.
PASS_ON_DEPTH_LIMIT: Final = 128

# The same rules as a JSON Schema pattern, for the OpenAPI document (clients and fuzzers read
# it); the validators below are what the server enforces.
TEXT_PATTERN: Final = "^[^\\x00-\\x08\\x0b\\x0c\\x0e-\\x1f\\x7f-\\x9f]*$"
LINE_PATTERN: Final = (
    "^[^\\x00-\\x1f\\x7f-\\x9f\\u200e\\u200f\\u061c\\u202a-\\u202e\\u2066-\\u2069\\u2028\\u2029]*$"
)


def text_problem(value: str, *, line: bool = False) -> str | None:
    """Why ``value`` may not be accepted, or None. ``line``: the stricter rules of a name."""
    for ch in value:
        code = ord(ch)
        if code == 0:
            return "must not contain NUL characters"
        if 0xD800 <= code <= 0xDFFF:
            return "must not contain lone surrogates (not valid Unicode text)"
        if code < 32:
            if line or ch not in "\t\n\r":
                return "must not contain control characters"
        elif 0x7F <= code <= 0x9F:
            return "must not contain control characters"
        elif line and ch in BIDI_CONTROLS:
            return "must not contain bidirectional text controls"
        elif line and ch in LINE_SEPARATORS:
            return "must not contain line or paragraph separators"
    return None


def storable(value: str) -> bool:
    """Whether PostgreSQL can store ``value`` at all (no NUL, no lone surrogate)."""
    return "\x00" not in value and not has_lone_surrogate(value)


def has_lone_surrogate(value: str) -> bool:
    """Whether ``value`` holds a lone surrogate: it has no UTF-8 encoding, so it can be neither
    stored nor sent."""
    return not value.isascii() and any(0xD800 <= ord(ch) <= 0xDFFF for ch in value)


def _check_text(value: str) -> str:
    problem = text_problem(value)
    if problem:
        raise ValueError(problem)
    return value


def _check_line(value: str) -> str:
    problem = text_problem(value, line=True)
    if problem:
        raise ValueError(problem)
    return value


def sendable_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent at all (a lone surrogate), or None: the one text rule of a
    body passed on to a provider as it is (the drop-in endpoints), whose text is otherwise the
    client's and the provider's business."""
    return (
        "must not contain lone surrogates (not valid Unicode text)"
        if has_lone_surrogate(value)
        else None
    )


def json_problem(
    value: Any,
    *,
    depth_limit: int = JSON_DEPTH_LIMIT,
    strings: Callable[[str], str | None] | None = text_problem,
) -> str | None:
    """Why a JSON value (a tool's schema, a body) may not be accepted: nesting deeper than
    ``depth_limit``, or a string or key that ``strings`` refuses (``text_problem``; None: any
    string). One walk, iterative: any depth."""
    for item, depth in _walk(value):
        if depth > depth_limit:
            return f"must not nest deeper than {depth_limit} levels"
        if strings is not None and isinstance(item, str):
            problem = strings(item)
            if problem:
                return problem
    return None


def json_loads(
    raw: bytes | str,
    *,
    depth_limit: int = JSON_DEPTH_LIMIT,
    strings: Callable[[str], str | None] | None = None,
) -> Any:
    """``raw`` parsed as JSON, or ValueError saying why not (for the field ``body``): not JSON,
    or what ``json_problem`` refuses with these arguments (by default only nesting deeper than
    ``depth_limit``; never a RecursionError, whatever the depth)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise ValueError(f"must not nest deeper than {depth_limit} levels") from None
    except ValueError:  # UnicodeDecodeError among them
        raise ValueError("not valid JSON") from None
    problem = json_problem(value, depth_limit=depth_limit, strings=strings)
    if problem:
        raise ValueError(problem)
    return value


# The widest integer a provider's JSON parser (or a column here) takes: a signed 64-bit one.
INT64_MAX: Final = 2**63 - 1


def number_problem(value: Any) -> tuple[str, str] | None:
    """(where, why) for the first number in a JSON value that no provider reads as a number:
    NaN or an infinity, or an integer wider than 64 bits; None when every number is fine.
    ``where`` is the field's path (``temperature``, ``messages[2].x``)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path or "body", "must be a finite number"
        if (
            isinstance(item, int)
            and not isinstance(item, bool)
            and not -INT64_MAX - 1 <= item <= INT64_MAX
        ):
            return path or "body", "must be an integer that fits in 64 bits"
        if isinstance(item, dict):
            stack.extend(
                (child, f"{path}.{key}" if path else str(key))
                for key, child in reversed(item.items())
            )
        elif isinstance(item, list):
            stack.extend(
                (child, f"{path}[{index}]") for index, child in reversed(list(enumerate(item)))
            )
    return None


def _walk(value: Any) -> Iterator[tuple[Any, int]]:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        yield item, depth
        if isinstance(item, dict):
            for key, child in item.items():
                yield key, depth + 1
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)


def _check_json(value: Any) -> Any:
    problem = json_problem(value)
    if problem:
        raise ValueError(problem)
    return value


# The types every schema uses. ``Line``: a one-line label; ``Text``: free text.
Text = Annotated[
    str, AfterValidator(_check_text), Field(json_schema_extra={"pattern": TEXT_PATTERN})
]
Line = Annotated[
    str, AfterValidator(_check_line), Field(json_schema_extra={"pattern": LINE_PATTERN})
]
SafeJson = Annotated[Any, AfterValidator(_check_json)]


# The instants a client may give (a price's effective_from, a query's since and until): both
# Python and PostgreSQL hold every one of them in any zone, and none is before prices or calls
# could exist. Outside, an offset can push a stored value past Python's datetime (year 1 at
# +05:00 is stored as 1 BC), and every later read of that row fails.
INSTANT_MIN: Final = datetime(1970, 1, 1, tzinfo=UTC)
INSTANT_MAX: Final = datetime(9000, 1, 1, tzinfo=UTC)


def instant_problem(value: datetime) -> str | None:
    """Why an aware ``value`` may not be accepted (outside [INSTANT_MIN, INSTANT_MAX) in UTC),
    or None. Compared, not converted: converting year 1 at +05:00 to UTC overflows."""
    if not INSTANT_MIN <= value < INSTANT_MAX:
        return "must be on or after 1970-01-01T00:00:00Z and before 9000-01-01T00:00:00Z"
    return None
