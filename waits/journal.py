"""Durable, pending and binding (DESIGN §6.4, §6.5): the process's view of the journal.

- durable: the reduction of exactly what the journal holds, cached per process. A cheap poll
  (``SELECT max(id)``, at most every ``JOURNAL_POLL_MS``) finds new rows and only those are
  read. Writers append under one transaction-level advisory lock, so ids become visible in
  order and "the rows after the last id I read" is exact. A full read (from the latest
  checkpoint) happens at start, when rows went missing, and every
  ``AGENTOPS_WAIT_RECHECK_MS`` while the records are unreadable.
- pending: acts of this process not yet seen in the journal (the write failed, was ambiguous,
  or ran inside a caller's transaction). They bind here at once and are offered again, in
  order, before every later act and at least every ``AGENTOPS_WAIT_RECHECK_MS``. An act's
  unique ``act_id`` makes the replay idempotent.
- binding: durable with pending applied. Every decision uses it.

Time comes from the caller (``now_ms``); the cadences above compare against it, and a ``now``
earlier than the last one counts as due.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.transaction import TransactionManagementError

from agentops.alerts import alert_raise
from agentops.exceptions import Conflict
from agentops.models import Alert

from .core import (
    Entry,
    Malformed,
    Unreadable,
    WaitBook,
    entry_parse,
    journal_reduce,
    pending_overlay,
    wait_snapshot,
)
from .models import WaitJournalEntry

logger = logging.getLogger(__name__)

# How stale the cached durable state may be: a wait or release made in another process binds
# here within this long (plus one query).
JOURNAL_POLL_MS: Final = 500.0
# pg_advisory_xact_lock(classid, objid): the two-key space does not overlap the one-key space.
_LOCK_CLASS: Final = 0x57414954  # "WAIT"
_LOCK_APPEND: Final = 1
_LOCK_FRAMEWORK_ALERT: Final = 2
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)

# What the write path treats as "the database is failing": the act stays pending. A durable
# atomic block inside a caller's transaction raises RuntimeError before touching anything.
WRITE_ERRORS: Final = (DatabaseError, TransactionManagementError, RuntimeError)
READ_ERRORS: Final = (DatabaseError, TransactionManagementError)

_TABLE = WaitJournalEntry._meta.db_table
_COLUMNS = ("act_id", "kind", "agent", "model", "until_ms", "reason", "by", "at", "data")
_INSERT_SQL = (
    f"INSERT INTO {connection.ops.quote_name(_TABLE)} ({', '.join(connection.ops.quote_name(c) for c in _COLUMNS)}) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb) ON CONFLICT (act_id) DO NOTHING RETURNING id"
)
_READ_FIELDS = ("id", "act_id", "kind", "agent", "model", "until_ms", "reason", "by", "at", "data")


def ms_to_datetime(ms: float) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


def datetime_to_ms(value: datetime) -> float:
    return (value - _EPOCH) / timedelta(milliseconds=1)


def row_mapping(row: Mapping[str, Any]) -> dict[str, Any]:
    """A journal row as ``waits.core.entry_parse`` reads it."""
    at = row.get("at")
    return {**row, "at_ms": datetime_to_ms(at) if isinstance(at, datetime) else None}


# What to write with an act, inside the act's own transaction, once its row is inserted (so it
# happens exactly once, even when the act is replayed): an audit entry, an alert. The argument
# is how the act's outcome was reported to its caller: "recorded", or "pending" for a replay.
OnInsert = Callable[[str], None]


@dataclass
class Act:
    entry: Entry
    act_id: uuid.UUID
    by: str
    on_insert: OnInsert | None = None
    written: bool = False  # committed, not yet seen by a read
    attempts: int = 0


@dataclass
class _State:
    durable: WaitBook | None = None
    last_id: int = 0
    polled_at: float | None = None
    reread_at: float | None = None
    offered_at: float | None = None
    pending: OrderedDict[uuid.UUID, Act] = field(default_factory=OrderedDict)
    binding: WaitBook | None = None
    episode_alerted: bool = False
    alert_tried_at: float | None = None
    read_failing: bool = False


def _due(last: float | None, now_ms: float, every_ms: float) -> bool:
    return last is None or now_ms < last or now_ms - last >= every_ms


class Journal:
    """The process-local view. Module-level functions below use the one instance."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._s = _State()

    # --- reads ------------------------------------------------------------------------

    def binding(self, *, now_ms: float) -> WaitBook:
        """The binding book at ``now``, refreshing what is due first. Cheap when nothing is due:
        no query, one lock. The book is never changed once handed out (a refresh replaces it),
        so a caller may read it after the lock is released."""
        with self._lock:
            self._refresh(now_ms)
            return self._binding()

    def _binding(self) -> WaitBook:
        s = self._s
        if s.binding is None:
            assert s.durable is not None
            s.binding = pending_overlay(s.durable, (act.entry for act in s.pending.values()))
        return s.binding

    def _refresh(self, now_ms: float, *, for_act: bool = False) -> None:
        """Do what is due. Before an act (``for_act``), pending acts are offered and new rows
        read whatever the cadence, so the act is decided against a fresh view."""
        s = self._s
        recheck_ms = settings.AGENTOPS_WAIT_RECHECK_MS
        loaded = False
        if s.durable is None or (s.durable.unreadable is not None and _due(s.reread_at, now_ms, recheck_ms)):
            self._load(now_ms)
            loaded = True
        offered = bool(s.pending) and (for_act or _due(s.offered_at, now_ms, recheck_ms)) and self._offer(now_ms)
        if not (loaded or offered) and (for_act or _due(s.polled_at, now_ms, JOURNAL_POLL_MS)):
            self._poll(now_ms)
        self._episode(now_ms)

    def _load(self, now_ms: float) -> None:
        """Read the journal from its latest checkpoint and reduce it."""
        s = self._s
        s.reread_at = s.polled_at = now_ms
        try:
            start = (
                WaitJournalEntry.objects.filter(kind=WaitJournalEntry.Kind.CHECKPOINT)
                .order_by("-id").values_list("id", flat=True).first()
            ) or 0
            rows = list(WaitJournalEntry.objects.filter(id__gte=start).order_by("id").values(*_READ_FIELDS))
        except READ_ERRORS as exc:
            self._read_failed(exc)
            if s.durable is None:
                book = WaitBook()
                book.mark_unreadable(None, f"the journal could not be read ({type(exc).__name__}: {str(exc)[:200]})")
                self._set_durable(book, last_id=0, was_readable=True)
            return
        s.read_failing = False
        was_readable = s.durable is None or s.durable.readable
        book = journal_reduce(row_mapping(row) for row in rows)
        self._set_durable(book, last_id=rows[-1]["id"] if rows else 0, was_readable=was_readable)
        self._seen(row["act_id"] for row in rows)

    def _poll(self, now_ms: float) -> None:
        """Read the rows appended since the last read, if any."""
        s = self._s
        assert s.durable is not None
        s.polled_at = now_ms
        try:
            newest = WaitJournalEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0
            if newest == s.last_id:
                return
            if newest < s.last_id:  # rows went missing (removed in SQL): read everything again
                self._load(now_ms)
                return
            rows = list(WaitJournalEntry.objects.filter(id__gt=s.last_id).order_by("id").values(*_READ_FIELDS))
        except READ_ERRORS as exc:
            self._read_failed(exc)  # keep the cached state: it is a true prefix of the journal
            return
        s.read_failing = False
        if not rows:
            return
        # Copy on write: a book handed out (to a thread iterating it) never changes under it.
        was_readable = s.durable.readable
        book = journal_reduce((row_mapping(row) for row in rows), s.durable.copy())
        self._set_durable(book, last_id=rows[-1]["id"], was_readable=was_readable)
        self._seen(row["act_id"] for row in rows)

    def _read_failed(self, exc: BaseException) -> None:
        if not self._s.read_failing:
            logger.warning(
                "provider-waits journal: could not read it (%s: %s); using the state read before, retrying at the next check",
                type(exc).__name__, str(exc)[:300],
            )
        self._s.read_failing = True
        _connection_recover()

    def _set_durable(self, book: WaitBook, *, last_id: int, was_readable: bool) -> None:
        s = self._s
        s.durable, s.last_id, s.binding = book, last_id, None
        if book.unreadable is not None and was_readable:
            logger.error(
                "provider-waits journal is unreadable (%s): no provider call is admitted for any agent "
                "until it reads again (re-read every %g ms) or an operator releases",
                book.unreadable.describe(), settings.AGENTOPS_WAIT_RECHECK_MS,
            )
        elif book.readable and not was_readable:
            logger.warning("provider-waits journal reads again: holds follow the recorded waits")

    def _seen(self, act_ids: Iterator[uuid.UUID]) -> None:
        s = self._s
        if s.pending and any([s.pending.pop(act_id, None) is not None for act_id in act_ids]):
            s.binding = None

    def _episode(self, now_ms: float) -> None:
        """Raise the framework alert once per episode of unreadable records."""
        s = self._s
        assert s.durable is not None
        cause = s.durable.unreadable
        if cause is None:
            s.episode_alerted, s.alert_tried_at = False, None
            return
        if s.episode_alerted or not _due(s.alert_tried_at, now_ms, settings.AGENTOPS_WAIT_RECHECK_MS):
            return
        s.alert_tried_at = now_ms
        s.episode_alerted = _framework_alert(cause, now_ms=now_ms)

    # --- writes ---------------------------------------------------------------------------

    @contextmanager
    def session(self, *, now_ms: float) -> Iterator[Session]:
        """Hold the process's journal lock for one act (see ``_refresh``)."""
        with self._lock:
            self._refresh(now_ms, for_act=True)
            yield Session(self, now_ms)

    def _append(self, act: Act, now_ms: float) -> bool:
        """Add ``act`` after the pending ones; write it if nothing is waiting before it.
        Returns whether it is recorded."""
        s = self._s
        s.pending[act.act_id] = act
        s.binding = None
        if any(not a.written for a in s.pending.values() if a is not act):
            logger.warning(
                "provider-waits journal: %s for agent %s model %s waits behind %d act(s) not yet recorded; "
                "it binds in this process and is offered again in order",
                act.entry.kind, act.entry.agent, act.entry.model, len(s.pending) - 1,
            )
            return False
        recorded = self._write(act, replay=False)
        if recorded:
            self._poll(now_ms)
        else:
            s.offered_at = now_ms
        return recorded

    def _offer(self, now_ms: float) -> bool:
        """Offer the pending acts to the journal, in order; stop at the first that fails.
        Returns whether any was written (the new rows have then been read)."""
        s = self._s
        s.offered_at = now_ms
        wrote = False
        for act in list(s.pending.values()):
            if act.written:
                continue
            if not self._write(act, replay=True):
                break
            wrote = True
        if wrote:
            self._poll(now_ms)
        return wrote

    def _write(self, act: Act, *, replay: bool) -> bool:
        entry = act.entry
        act.attempts += 1
        try:
            # durable=True: the act commits on its own, never inside a caller's transaction
            # that could still roll it back (that raises RuntimeError: the act stays pending).
            with transaction.atomic(durable=True), connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_CLASS, _LOCK_APPEND])
                cursor.execute(
                    _INSERT_SQL,
                    [
                        act.act_id, entry.kind, entry.agent, entry.model, entry.until, entry.reason, act.by,
                        ms_to_datetime(entry.at), json.dumps({}),
                    ],
                )
                inserted = cursor.fetchone() is not None
                # Not inserted: an earlier, ambiguous attempt did commit, with its side effects.
                if inserted and act.on_insert is not None:
                    act.on_insert("pending" if replay else "recorded")
        except WRITE_ERRORS as exc:
            _connection_recover()
            logger.warning(
                "provider-waits journal: could not record %s for agent %s model %s (attempt %d; %s: %s); "
                "it binds in this process and is offered again at the next act and within %d ms",
                entry.kind, entry.agent, entry.model, act.attempts, type(exc).__name__, str(exc)[:300],
                settings.AGENTOPS_WAIT_RECHECK_MS,
            )
            return False
        act.written = True
        if replay:
            logger.warning(
                "provider-waits journal: recorded %s for agent %s model %s on attempt %d",
                entry.kind, entry.agent, entry.model, act.attempts,
            )
        return True

    # --- process state ----------------------------------------------------------------

    def pending(self) -> list[Act]:
        with self._lock:
            return list(self._s.pending.values())

    def forget(self) -> None:
        with self._lock:
            self._s = _State()


class Session:
    """One act's view, under the process's journal lock (see ``Journal.session``)."""

    def __init__(self, journal: Journal, now_ms: float) -> None:
        self._journal = journal
        self.now_ms = now_ms

    @property
    def binding(self) -> WaitBook:
        return self._journal._binding()

    def append(self, entry: Entry, *, by: str, on_insert: OnInsert | None = None) -> bool:
        """Make ``entry`` (a set or a release) an act of this process: it binds here at once.
        Returns True when it is recorded in the journal, False when it is pending."""
        act = Act(entry=entry, act_id=uuid.uuid4(), by=by, on_insert=on_insert)
        return self._journal._append(act, self.now_ms)


def _connection_recover() -> None:
    """After a database error outside any transaction, drop a broken connection so the next
    query opens a new one (Django only does this between requests)."""
    if not connection.in_atomic_block:
        try:
            connection.close_if_unusable_or_obsolete()
        except DatabaseError:  # closing a dead connection can fail too; it is gone either way
            pass


def _framework_alert(cause: Unreadable, *, now_ms: float) -> bool:
    """The provider-wait alert for agent ``framework``, model ``*`` (§6.5). Workers share it:
    a cause already alerted and not acknowledged is not raised again. Returns whether the
    alert stands; a failure to raise it leaves the hold as it is and is retried at the next
    re-read."""
    key = {"row": cause.row_id, "problem": cause.problem}
    recheck_s = settings.AGENTOPS_WAIT_RECHECK_MS / 1000
    message = (
        f"The provider-waits journal cannot be read ({cause.describe()}). No provider call is admitted "
        f"for any agent (shown as model *) until it reads again; it is re-read every {recheck_s:g} s. "
        "Inspect the row with GET /api/v1/waits/journal or the admin's provider-wait journal, then repair or "
        f"remove it in SQL (table {_TABLE}); calls resume by themselves at the next re-read. To let an agent "
        "call meanwhile, release it: POST /api/v1/waits/release {\"agent\": NAME}, the admin's Binding waits "
        "page, or python manage.py release_wait NAME --reason TEXT."
    )
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_CLASS, _LOCK_FRAMEWORK_ALERT])
            standing = Alert.objects.filter(
                kind="provider-wait", agent="framework", acknowledged_at__isnull=True, data__cause=key
            ).exists()
            if not standing:
                alert_raise(
                    kind="provider-wait", agent="framework", model="*", message=message,
                    data={"cause": key, "held": "every model of every agent", "since": ms_to_datetime(now_ms).isoformat()},
                )
    except READ_ERRORS as exc:
        _connection_recover()
        logger.error(
            "could not raise the provider-wait alert for the unreadable journal (%s: %s); retrying at the next re-read",
            type(exc).__name__, str(exc)[:300],
        )
        return False
    return True


def checkpoint_write(*, now_ms: float, by: str) -> int:
    """Append a checkpoint: the waits that bind at ``now``, read fresh from the journal under
    the append lock (so no act lands between the read and the checkpoint). A full read starts
    at the latest checkpoint. Refused (Conflict) while the records are unreadable: a
    checkpoint must never paper over a row that does not read. Returns the checkpoint's id."""
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [_LOCK_CLASS, _LOCK_APPEND])
        start = (
            WaitJournalEntry.objects.filter(kind=WaitJournalEntry.Kind.CHECKPOINT)
            .order_by("-id").values_list("id", flat=True).first()
        ) or 0
        rows = list(WaitJournalEntry.objects.filter(id__gte=start).order_by("id").values(*_READ_FIELDS))
        book = journal_reduce(row_mapping(row) for row in rows)
        if book.unreadable is not None:
            raise Conflict(
                f"the journal is unreadable ({book.unreadable.describe()}); "
                "repair that row before writing a checkpoint"
            )
        waits = sorted(book.binding(now_ms), key=lambda w: (w.agent, w.model))
        data = {"waits": [wait_snapshot(w) for w in waits], "through": rows[-1]["id"] if rows else 0}
        cursor.execute(
            _INSERT_SQL,
            [uuid.uuid4(), "checkpoint", "", "", None, f"{len(waits)} binding wait(s)", by, ms_to_datetime(now_ms), json.dumps(data)],
        )
        found = cursor.fetchone()
        assert found is not None  # a fresh act_id cannot conflict
        return int(found[0])


def entry_problem(row: Mapping[str, Any]) -> str | None:
    """Why a journal row does not read as a wait, or None."""
    try:
        entry_parse(row_mapping(row))
    except Malformed as exc:
        return exc.problem
    return None


# --- the process's journal ---------------------------------------------------------------

_journal = Journal()


def journal_binding(*, now_ms: float) -> WaitBook:
    """What binds in this process at ``now``. Do not change the returned book."""
    return _journal.binding(now_ms=now_ms)


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
