"""Unreadable records fail closed (architecture.md §6.5): the framework alert, raised once per
episode and shared by every worker."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import connection, transaction

from agentops.alerts import alert_raise
from agentops.models import Alert

from ..core import Unreadable
from .rows import (
    LOCK_CLASS,
    LOCK_FRAMEWORK_ALERT,
    READ_ERRORS,
    TABLE,
    connection_recover,
    ms_to_datetime,
)

logger = logging.getLogger("waits.journal")


def framework_alert(cause: Unreadable, *, now_ms: float) -> bool:
    """The provider-wait alert for agent ``framework``, model ``*`` (§6.5). Workers share it:
    a cause already alerted and not acknowledged is not raised again. Returns whether the
    alert stands; a failure to raise it leaves the hold as it is and is retried at the next
    re-read."""
    key = {"row": cause.row_id, "problem": cause.problem}
    recheck_s = settings.AGENTOPS_WAIT_RECHECK_MS / 1000
    message = (
        f"The provider-waits journal cannot be read ({cause.describe()}). "
        "No provider call is admitted for any agent (shown as model *) until it reads again; "
        f"it is re-read every {recheck_s:g} s. "
        "Inspect the row with GET /api/v1/waits/journal or the admin's provider-wait journal, "
        f"then repair or remove it in SQL (table {TABLE}); "
        "calls resume by themselves at the next re-read. To let an agent call meanwhile, "
        'release it: POST /api/v1/waits/release {"agent": NAME}, '
        "the admin's Binding waits page, or python manage.py release_wait NAME --reason TEXT."
    )
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT pg_advisory_xact_lock(%s, %s)", [LOCK_CLASS, LOCK_FRAMEWORK_ALERT]
                )
            standing = Alert.objects.filter(
                kind="provider-wait",
                agent="framework",
                acknowledged_at__isnull=True,
                data__cause=key,
            ).exists()
            if not standing:
                alert_raise(
                    kind="provider-wait",
                    agent="framework",
                    model="*",
                    message=message,
                    data={
                        "cause": key,
                        "held": "every model of every agent",
                        "since": ms_to_datetime(now_ms).isoformat(),
                    },
                )
    except READ_ERRORS as exc:
        connection_recover()
        logger.error(
            "could not raise the provider-wait alert for the unreadable journal (%s: %s); "
            "retrying at the next re-read",
            type(exc).__name__,
            str(exc)[:300],
        )
        return False
    return True
