"""Bounding failure text before it is stored, logged or sent (DESIGN §5.6)."""

from __future__ import annotations

FAILURE_TEXT_LIMIT = 2000
NOTE_TEXT_LIMIT = 600
PROVIDER_CODE_LIMIT = 128


def bound_text(text: str, limit: int = FAILURE_TEXT_LIMIT) -> str:
    """Return ``text`` unchanged if it fits in ``limit`` characters, else head + marker + tail.

    The marker says how many characters were left out. Python strings hold code points, so a
    cut never splits a surrogate pair of a well-formed string; lone surrogates (from a bad
    decode) at a cut edge are dropped rather than kept half.
    """
    if len(text) <= limit:
        return text
    omitted = len(text) - limit
    # The marker's own length depends on the count; size it for the worst case first.
    marker = f" …[{omitted} of {len(text)} characters omitted]… "
    keep = max(limit - len(marker), 0)
    head_len = (keep + 1) // 2
    tail_len = keep - head_len
    head = text[:head_len]
    tail = text[len(text) - tail_len :] if tail_len else ""
    omitted = len(text) - len(head) - len(tail)
    marker = f" …[{omitted} of {len(text)} characters omitted]… "
    result = _strip_lone_surrogates(head) + marker + _strip_lone_surrogates(tail)
    return result[:limit]


def _strip_lone_surrogates(part: str) -> str:
    if part and "\ud800" <= part[-1] <= "\udbff":
        part = part[:-1]
    if part and "\udc00" <= part[0] <= "\udfff":
        part = part[1:]
    return part


def clean_requester(value: str, limit: int = 200) -> str:
    """Control characters become spaces; the result is stripped and bounded."""
    cleaned = "".join(" " if (ord(ch) < 32 or 127 <= ord(ch) < 160) else ch for ch in value)
    return cleaned.strip()[:limit]
