"""The provider-waits journal (architecture.md §6.4, §6.5), as the rest of the service uses it.

- ``view``: this process's cached view (durable, pending, binding) and its refresh cadence;
- ``writes``: appending an act, and checkpoints;
- ``unreadable``: the framework alert when the records do not read (fail closed);
- ``rows``: the table's SQL and the row encoding.

The functions below act on the one view this process holds.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from ..core import WaitBook
from .rows import (
    READ_ERRORS,
    WRITE_ERRORS,
    datetime_to_ms,
    entry_problem,
    ms_to_datetime,
    row_mapping,
)
from .view import JOURNAL_POLL_MS, Journal, Session
from .writes import Act, OnInsert, checkpoint_write

__all__ = [
    "JOURNAL_POLL_MS",
    "READ_ERRORS",
    "WRITE_ERRORS",
    "Act",
    "Journal",
    "OnInsert",
    "Session",
    "checkpoint_write",
    "datetime_to_ms",
    "entry_problem",
    "journal_binding",
    "journal_forget_process_state",
    "journal_pending",
    "journal_session",
    "ms_to_datetime",
    "row_mapping",
]

_journal = Journal()


def journal_binding(*, now_ms: float, fresh: bool = False) -> WaitBook:
    """What binds in this process at ``now``. Do not change the returned book. ``fresh``
    reads rows other processes appended whatever the poll cadence (one more query)."""
    return _journal.binding(now_ms=now_ms, fresh=fresh)


def journal_session(*, now_ms: float) -> AbstractContextManager[Session]:
    """``with journal_session(now_ms=...) as session:`` for one act (services only)."""
    return _journal.session(now_ms=now_ms)


def journal_pending() -> list[Act]:
    """This process's acts not yet seen in the journal, in order."""
    return _journal.pending()


def journal_forget_process_state() -> None:
    """Drop this process's cached journal state and its pending acts, as a restart does.
    Pending acts are lost. For tests and for a process that must re-read from scratch."""
    _journal.forget()
