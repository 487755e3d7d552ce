"""The JSON-lines failure log (architecture.md §8, §10 ``AGENTOPS_FAILURES_LOG``).

One line per incident: a terminal failure, an alert. Every string field is bounded before it
is written, so a provider's 1 MB error body never reaches the file whole. Each line names the
host, process and Celery worker that wrote it and, while a span is current (a turn's, a
request's), its ``trace_id`` and ``span_id``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings

from .telemetry import process_identity, trace_ids
from .text import bound_data

logger = logging.getLogger(__name__)


def failures_log_write(
    *, kind: str, agent: str, model: str = "", message: str, **fields: Any
) -> None:
    """Append one record. A failure to write is logged, never raised: the caller's own
    record (a turn row, an alert row) stays the source of truth."""
    record = bound_data(
        {
            "at": datetime.now(UTC).isoformat(),
            "kind": kind,
            "agent": agent,
            "model": model,
            "message": message,
            **fields,
            # Where it was written (failures.log is per host) and, while a span is current, its
            # trace.
            **process_identity(),
            **trace_ids(),
        }
    )
    line = json.dumps(record, ensure_ascii=False, default=str)
    path = Path(settings.AGENTOPS_FAILURES_LOG)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            # One writer at a time, among this process's threads and the host's other
            # processes (the web and the workers share the file): each record is one whole line.
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError:
        logger.exception("could not write to the failure log %s", path)
