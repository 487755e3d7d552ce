"""Durable, pending and binding (architecture.md §6.4, §6.5): the process's view of the journal.

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

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Final

from django.conf import settings

from ..core import EVERY_AGENT, Entry, WaitBook, journal_reduce, pending_overlay
from .rows import (
    READ_ERRORS,
    connection_recover,
    newest_id,
    row_mapping,
    rows_after,
    rows_from_checkpoint,
)
from .unreadable import framework_alert
from .writes import Act, OnInsert, act_write

logger = logging.getLogger("waits.journal")

# How stale the cached durable state may be: a wait or release made in another process binds
# here within this long (plus one query).
JOURNAL_POLL_MS: Final = 500.0
# How long a fresh check waits for another thread's read in progress before it answers from
# the view already read (``Journal.binding``).
FRESH_WAIT_MS: Final = 250.0
# How long past the pool's timeout a check waits for another thread's first read of the
# journal (see ``busy_wait_s``).
JOURNAL_BUSY_MARGIN_MS: Final = 1000.0


def busy_wait_s() -> float:
    """How long a check waits for another thread's read when this process has no view yet.

    As long as that read may legitimately wait for a connection (the pool's timeout), plus a
    margin: a first read that is merely slow, as when a worker starts a thousand turns at once,
    is waited for, not taken for an unreadable journal (which would hold every turn until its
    re-check). Past it the check fails closed (§6.5) rather than queue behind a database that
    does not answer."""
    pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
    timeout_s = float(pool.get("timeout", 30.0)) if isinstance(pool, dict) else 0.0
    return timeout_s + JOURNAL_BUSY_MARGIN_MS / 1000


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
        # The binding book of the current state, for checks that find the lock taken. Set
        # under the lock before any query, so it never lacks an act made in this process.
        self._published: WaitBook | None = None
        # True from the moment a read under the lock has seen rows newer than the published
        # book until the book that has them is published: the published book is then no
        # longer known to be current, so a check that finds the lock taken waits for it
        # (fail closed without a window: an unreadable row seen by any thread of the process
        # refuses the very next check).
        self._superseded = False

    # --- reads ------------------------------------------------------------------------

    def binding(self, *, now_ms: float, fresh: bool = False) -> WaitBook:
        """The binding book at ``now``, refreshing what is due first. Cheap when nothing is due:
        no query, one lock. The book is never changed once handed out (a refresh replaces it),
        so a caller may read it after the lock is released.

        Never queues behind another thread's read or act, which may wait on the database: the
        book as it stands is returned instead (a true prefix of the journal with this
        process's acts applied, as when a poll fails). With no book yet, it waits up to
        ``busy_wait_s()`` and then returns one that holds every model (fail closed).

        ``fresh``: poll for new rows whatever the cadence, after a read another thread has in
        progress (waited for up to ``FRESH_WAIT_MS``: a poll takes milliseconds, and one that
        waits on the database is not queued behind), so the book has every row committed
        before this call. For the admission check (a wait any process committed binds every
        process's next call) and reads a person follows (the admin, ``GET /waits``)."""
        if self._published is not None:
            acquired = self._lock.acquire(blocking=False)
            if not acquired and self._superseded:
                # Newer rows are being read: wait for their book, as a first read is waited for.
                acquired = self._lock.acquire(timeout=busy_wait_s())
            elif not acquired and fresh:
                acquired = self._lock.acquire(timeout=FRESH_WAIT_MS / 1000)
        else:
            acquired = self._lock.acquire(timeout=busy_wait_s())
        if not acquired:
            published = self._published  # read after the try: it may have been published meanwhile
            return published if published is not None and not self._superseded else _busy_book()
        try:
            self._refresh(now_ms, poll=fresh)
            return self._binding()
        finally:
            self._lock.release()

    def _binding(self) -> WaitBook:
        s = self._s
        if s.binding is None:
            assert s.durable is not None
            s.binding = pending_overlay(s.durable, (act.entry for act in s.pending.values()))
            self._published = s.binding
            self._superseded = False
        return s.binding

    def _changed(self) -> None:
        """Durable or pending changed: compute and publish the new binding book now."""
        self._s.binding = None
        if self._s.durable is not None:
            self._binding()

    def _refresh(self, now_ms: float, *, for_act: bool = False, poll: bool = False) -> None:
        """Do what is due. Before an act (``for_act``), pending acts are offered and new rows
        read whatever the cadence, so the act is decided against a fresh view; ``poll`` reads
        new rows whatever the cadence."""
        s = self._s
        recheck_ms = settings.AGENTOPS_WAIT_RECHECK_MS
        loaded = False
        if s.durable is None or (
            s.durable.unreadable is not None and _due(s.reread_at, now_ms, recheck_ms)
        ):
            self._load(now_ms)
            loaded = True
        offered = (
            bool(s.pending)
            and (for_act or _due(s.offered_at, now_ms, recheck_ms))
            and self._offer(now_ms)
        )
        if not (loaded or offered) and (
            for_act or poll or _due(s.polled_at, now_ms, JOURNAL_POLL_MS)
        ):
            self._poll(now_ms)
        self._episode(now_ms)

    def _load(self, now_ms: float) -> None:
        """Read the journal from its latest checkpoint and reduce it."""
        s = self._s
        s.reread_at = s.polled_at = now_ms
        try:
            rows = rows_from_checkpoint()
        except READ_ERRORS as exc:
            self._read_failed(exc)
            if s.durable is None:
                book = WaitBook()
                book.mark_unreadable(
                    None, f"the journal could not be read ({type(exc).__name__}: {str(exc)[:200]})"
                )
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
            newest = newest_id()
            if newest == s.last_id:
                return
            self._superseded = True  # rows past the published book exist: it is not current
            if newest < s.last_id:  # rows went missing (removed in SQL): read everything again
                self._load(now_ms)
                return
            rows = rows_after(s.last_id)
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
                "provider-waits journal: could not read it (%s: %s); "
                "using the state read before, retrying at the next check",
                type(exc).__name__,
                str(exc)[:300],
            )
        self._s.read_failing = True
        connection_recover()

    def _set_durable(self, book: WaitBook, *, last_id: int, was_readable: bool) -> None:
        s = self._s
        s.durable, s.last_id = book, last_id
        self._changed()
        if book.unreadable is not None and was_readable:
            logger.error(
                "provider-waits journal is unreadable (%s): "
                "no provider call is admitted for any agent "
                "until it reads again (re-read every %g ms) or an operator releases",
                book.unreadable.describe(),
                settings.AGENTOPS_WAIT_RECHECK_MS,
            )
        elif book.readable and not was_readable:
            logger.warning("provider-waits journal reads again: holds follow the recorded waits")

    def _seen(self, act_ids: Iterator[uuid.UUID]) -> None:
        s = self._s
        if s.pending and any([s.pending.pop(act_id, None) is not None for act_id in act_ids]):
            self._changed()

    def _episode(self, now_ms: float) -> None:
        """Raise the framework alert once per episode of unreadable records."""
        s = self._s
        assert s.durable is not None
        cause = s.durable.unreadable
        if cause is None:
            s.episode_alerted, s.alert_tried_at = False, None
            return
        if s.episode_alerted or not _due(
            s.alert_tried_at, now_ms, settings.AGENTOPS_WAIT_RECHECK_MS
        ):
            return
        s.alert_tried_at = now_ms
        s.episode_alerted = framework_alert(cause, now_ms=now_ms)

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
        self._changed()  # before the write: a check meanwhile must see the act
        if any(not a.written for a in s.pending.values() if a is not act):
            logger.warning(
                "provider-waits journal: %s for agent %s model %s "
                "waits behind %d act(s) not yet recorded; "
                "it binds in this process and is offered again in order",
                act.entry.kind,
                act.entry.agent,
                act.entry.model,
                len(s.pending) - 1,
            )
            return False
        recorded = act_write(act, replay=False)
        if recorded:
            self._poll(now_ms)
        elif act.dropped:
            self._forget_dropped()
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
            if not act_write(act, replay=True):
                if act.dropped:
                    self._forget_dropped()
                    continue  # dropped for good: the acts behind it are offered now
                break
            wrote = True
        if wrote:
            self._poll(now_ms)
        return wrote

    def _forget_dropped(self) -> None:
        s = self._s
        for act_id in [a.act_id for a in s.pending.values() if a.dropped]:
            del s.pending[act_id]
        self._changed()

    # --- process state ----------------------------------------------------------------

    def pending(self) -> list[Act]:
        with self._lock:
            return list(self._s.pending.values())

    def forget(self) -> None:
        with self._lock:
            self._s = _State()
            self._published = None
            self._superseded = False


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
        Returns True when it is recorded in the journal, False when it is pending. An act the
        journal would not read back (a scoped act without its provider) is refused here, as
        a ValueError: once written it would make the records unreadable for every agent."""
        if entry.agent == EVERY_AGENT and not entry.provider:
            raise ValueError(f"a {entry.kind} for every agent must name its provider")
        act = Act(entry=entry, act_id=uuid.uuid4(), by=by, on_insert=on_insert)
        return self._journal._append(act, self.now_ms)


def _busy_book() -> WaitBook:
    book = WaitBook()
    book.mark_unreadable(
        None, f"another thread's read of the journal has not answered within {busy_wait_s():g} s"
    )
    return book
