"""How a journal row is stored and read back: the table's SQL, the instants' encoding, and
the database errors the journal treats as "the database is failing"."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from django.db import DatabaseError, connection
from django.db.transaction import TransactionManagementError

from ..core import Malformed, entry_parse
from ..models import WaitJournalEntry

# pg_advisory_xact_lock(classid, objid): the two-key space does not overlap the one-key space.
LOCK_CLASS: Final = 0x57414954  # "WAIT"
LOCK_APPEND: Final = 1
LOCK_FRAMEWORK_ALERT: Final = 2
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

# What the write path treats as "the database is failing": the act stays pending. A durable
# atomic block inside a caller's transaction raises RuntimeError before touching anything.
WRITE_ERRORS: Final = (DatabaseError, TransactionManagementError, RuntimeError)
READ_ERRORS: Final = (DatabaseError, TransactionManagementError)

TABLE = WaitJournalEntry._meta.db_table
_COLUMNS = (
    "act_id",
    "kind",
    "agent",
    "model",
    "until_ms",
    "reason",
    "by",
    "at",
    "data",
    "provider",
)
INSERT_SQL = (
    f"INSERT INTO {connection.ops.quote_name(TABLE)} "
    f"({', '.join(connection.ops.quote_name(c) for c in _COLUMNS)}) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb, %s) "
    "ON CONFLICT (act_id) DO NOTHING RETURNING id"
)
_READ_FIELDS = ("id", *_COLUMNS)


def ms_to_datetime(ms: float) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def datetime_to_ms(value: datetime) -> float:
    return (value - _EPOCH) / timedelta(milliseconds=1)


def row_mapping(row: Mapping[str, Any]) -> dict[str, Any]:
    """A journal row as ``waits.core.entry_parse`` reads it."""
    at = row.get("at")
    return {**row, "at_ms": datetime_to_ms(at) if isinstance(at, datetime) else None}


def entry_problem(row: Mapping[str, Any]) -> str | None:
    """Why a journal row does not read as a wait, or None."""
    try:
        entry_parse(row_mapping(row))
    except Malformed as exc:
        return exc.problem
    return None


def rows_from_checkpoint() -> list[dict[str, Any]]:
    """The rows a full read reduces: from the latest checkpoint on, in id order."""
    start = (
        WaitJournalEntry.objects.filter(kind=WaitJournalEntry.Kind.CHECKPOINT)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    ) or 0
    return list(WaitJournalEntry.objects.filter(id__gte=start).order_by("id").values(*_READ_FIELDS))


def rows_after(last_id: int) -> list[dict[str, Any]]:
    return list(
        WaitJournalEntry.objects.filter(id__gt=last_id).order_by("id").values(*_READ_FIELDS)
    )


def newest_id() -> int:
    return WaitJournalEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0


def connection_recover() -> None:
    """After a database error outside any transaction, drop a broken connection so the next
    query opens a new one (Django only does this between requests)."""
    if not connection.in_atomic_block:
        try:
            connection.close_if_unusable_or_obsolete()
        except DatabaseError:  # closing a dead connection can fail too; it is gone either way
            pass
