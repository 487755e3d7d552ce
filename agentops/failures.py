"""The JSON-lines failure log (DESIGN §8, §10 ``AGENTOPS_FAILURES_LOG``).

One line per incident: a terminal failure, an alert. Every string field is bounded before it
is written, so a provider's 1 MB error body never reaches the file whole.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings

from .text import bound_text

logger = logging.getLogger(__name__)
_lock = threading.Lock()


def _bounded(value: Any) -> Any:
    if isinstance(value, str):
        return bound_text(value)
    if isinstance(value, dict):
        return {str(k)[:128]: _bounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_bounded(v) for v in value[:100]]
    return value


def failures_log_write(*, kind: str, agent: str, model: str = "", message: str, **fields: Any) -> None:
    """Append one record. A failure to write is logged, never raised: the caller's own
    record (a turn row, an alert row) stays the source of truth."""
    record = _bounded(
        {"at": datetime.now(UTC).isoformat(), "kind": kind, "agent": agent, "model": model, "message": message, **fields}
    )
    line = json.dumps(record, ensure_ascii=False, default=str)
    path = Path(settings.AGENTOPS_FAILURES_LOG)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _lock, open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    except OSError:
        logger.exception("could not write to the failure log %s", path)
