"""Which rows make room (architecture.md §5.9, "Trim"): pure, over the presented history in
order. Rows go in units that are never split: an assistant row with tool calls goes with the
rows up to and including its last tool result, and a participant's message with the rows that
answer it (messages in a row start one unit together). System notes are units of their own
and go first; the current turn's rows (from its first trigger row on, or the newest unit when
it has none) never go."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Row:
    """What the selection reads of a presented row."""

    id: int
    seq: int
    role: str
    content: Any
    tokens: int
    participant: str = ""
    note: bool = False  # a system note that goes first (a summary is no such note)


@dataclass
class Unit:
    rows: list[Row] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.rows)

    @property
    def note(self) -> bool:
        return len(self.rows) == 1 and self.rows[0].note


@dataclass(frozen=True)
class Selection:
    """The rows to set aside (in the given order) and their tokens; ``fits`` says whether setting them
    aside brings the request to the target (when not, nothing is to be set aside)."""

    rows: list[Row]
    tokens: int
    fits: bool
    kept_tokens: int  # the current turn's own rows


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def units_of(rows: Sequence[Row]) -> list[Unit]:
    """The presented rows, in order, as units never to be split."""
    units: list[Unit] = []
    open_calls: set[str] = set()
    for row in rows:
        blocks = _blocks(row.content)
        calls = {str(b.get("id")) for b in blocks if b.get("type") == "tool_call"}
        results = {str(b.get("tool_call_id")) for b in blocks if b.get("type") == "tool_result"}
        # A tool call open (its result not yet seen) keeps every row in its unit; messages in a
        # row (one turn's, or a turn's and those that joined it) start one unit together.
        previous = units[-1].rows[-1].role if units else None
        starts = not open_calls and (
            not units
            or row.role == "system-note"
            or units[-1].note
            or (row.role == "user" and previous != "user")
        )
        if starts:
            units.append(Unit())
        units[-1].rows.append(row)
        open_calls = (open_calls | calls) - results
    return units


def select(rows: Sequence[Row], *, protected_from_seq: int | None, over_by: int) -> Selection:
    """The oldest units to set aside so that ``over_by`` tokens go: notes first (oldest first),
    then the other units oldest first. Rows at or after ``protected_from_seq`` (the current
    turn's) never go; without it, the newest unit never goes."""
    units = units_of(rows)
    if protected_from_seq is None:
        kept, free = units[-1:], units[:-1]
    else:
        # A unit that reaches into the current turn is the current turn's.
        kept = [u for u in units if u.rows[-1].seq >= protected_from_seq]
        free = [u for u in units if u.rows[-1].seq < protected_from_seq]
    kept_tokens = sum(u.tokens for u in kept)
    chosen: list[Unit] = []
    gone = 0
    for unit in [u for u in free if u.note] + [u for u in free if not u.note]:
        if gone >= over_by:
            break
        chosen.append(unit)
        gone += unit.tokens
    if gone < over_by:
        return Selection(rows=[], tokens=0, fits=False, kept_tokens=kept_tokens)
    chosen_ids = {r.id for u in chosen for r in u.rows}
    picked = [r for r in rows if r.id in chosen_ids]
    return Selection(rows=picked, tokens=gone, fits=True, kept_tokens=kept_tokens)
