"""The write path: one act appended under the journal's advisory lock, and checkpoints.

Writers append under one transaction-level advisory lock, so ids become visible in order and
a reader's "the rows after the last id I read" is exact (``waits.journal.view``)."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import DataError, connection, transaction

from agentops.alerts import alert_raise
from agentops.exceptions import Conflict

from ..core import Entry, journal_reduce, wait_binds, wait_snapshot
from .rows import (
    INSERT_SQL,
    LOCK_APPEND,
    LOCK_CLASS,
    WRITE_ERRORS,
    connection_recover,
    ms_to_datetime,
    row_mapping,
    rows_from_checkpoint,
)

logger = logging.getLogger("waits.journal")

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
    dropped: bool = False  # refused for good (see ``act_write``): never offered again


def act_write(act: Act, *, replay: bool) -> bool:
    """Insert ``act``'s row (idempotent on its ``act_id``). Returns whether it committed; a
    database failure is logged and leaves the act to be offered again. A failure that no retry
    can mend (the row's own data is refused: SQLSTATE class 22, or an error that is not the
    database's) marks the act ``dropped``, with a log line and an alert: a pending act must
    never block the acts behind it for good."""
    entry = act.entry
    act.attempts += 1
    try:
        # durable=True: the act commits on its own, never inside a caller's transaction
        # that could still roll it back (that raises RuntimeError: the act stays pending).
        with transaction.atomic(durable=True), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_CLASS, LOCK_APPEND])
            cursor.execute(
                INSERT_SQL,
                [
                    act.act_id,
                    entry.kind,
                    entry.agent,
                    entry.model,
                    entry.until,
                    entry.reason,
                    act.by,
                    ms_to_datetime(entry.at),
                    json.dumps(entry.data()),
                    entry.provider,
                ],
            )
            inserted = cursor.fetchone() is not None
            # Not inserted: an earlier, ambiguous attempt did commit, with its side effects.
            if inserted and act.on_insert is not None:
                act.on_insert("pending" if replay else "recorded")
    except DataError as exc:
        connection_recover()
        _drop(act, exc)
        return False
    except WRITE_ERRORS as exc:
        connection_recover()
        logger.warning(
            "provider-waits journal: could not record %s for agent %s model %s "
            "(attempt %d; %s: %s); "
            "it binds in this process and is offered again at the next act and within %d ms",
            entry.kind,
            entry.agent,
            entry.model,
            act.attempts,
            type(exc).__name__,
            str(exc)[:300],
            settings.AGENTOPS_WAIT_RECHECK_MS,
        )
        return False
    except Exception as exc:  # not a database failure: retrying cannot mend it
        connection_recover()
        _drop(act, exc)
        return False
    act.written = True
    if replay:
        logger.warning(
            "provider-waits journal: recorded %s for agent %s model %s on attempt %d",
            entry.kind,
            entry.agent,
            entry.model,
            act.attempts,
        )
    return True


def _drop(act: Act, exc: BaseException) -> None:
    """Give up on ``act`` for good: log it and raise an alert (outside the act's rolled-back
    transaction). The act no longer binds in this process."""
    entry = act.entry
    act.dropped = True
    problem = f"{type(exc).__name__}: {str(exc)[:300]}"
    message = (
        f"A provider-waits act ({entry.kind} for agent {entry.agent!a} model {entry.model!a}) "
        f"could not be recorded and was dropped: the database refused its data ({problem!a}). "
        "Acts after it are recorded as usual."
    )
    logger.error("provider-waits journal: %s", message)
    try:
        alert_raise(
            kind="journal-act-dropped",
            agent=ascii(entry.agent)[1:-1][:100],
            model=ascii(entry.model)[1:-1][:200],
            message=message,
            data={
                "kind": entry.kind,
                "by": ascii(act.by),
                "act_id": str(act.act_id),
                "error": problem.encode("ascii", "backslashreplace").decode(),
            },
        )
    except Exception:  # the act is dropped either way; the log line above says so
        connection_recover()
        logger.exception("provider-waits journal: could not store the alert for a dropped act")


def checkpoint_write(*, now_ms: float, by: str) -> int:
    """Append a checkpoint: the waits that bind at ``now``, read fresh from the journal under
    the append lock (so no act lands between the read and the checkpoint). A full read starts
    at the latest checkpoint. Refused (Conflict) while the records are unreadable: a
    checkpoint must never paper over a row that does not read. Returns the checkpoint's id."""
    with transaction.atomic(durable=True), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_CLASS, LOCK_APPEND])
        rows = rows_from_checkpoint()
        book = journal_reduce(row_mapping(row) for row in rows)
        if book.unreadable is not None:
            raise Conflict(
                f"the journal is unreadable ({book.unreadable.describe()}); "
                "repair that row before writing a checkpoint"
            )
        waits = sorted(book.binding(now_ms), key=lambda w: (w.agent, w.model, w.provider))
        holds = sorted(
            (h for h in book.holds.values() if wait_binds(h.until, now_ms)), key=lambda w: w.ref
        )
        data = {
            "waits": [wait_snapshot(w) for w in waits],
            "holds": [wait_snapshot(w) for w in holds],
            "through": rows[-1]["id"] if rows else 0,
        }
        cursor.execute(
            INSERT_SQL,
            [
                uuid.uuid4(),
                "checkpoint",
                "",
                "",
                None,
                f"{len(waits)} binding wait(s)",
                by,
                ms_to_datetime(now_ms),
                json.dumps(data),
                "",
            ],
        )
        found = cursor.fetchone()
        assert found is not None  # a fresh act_id cannot conflict
        return int(found[0])
