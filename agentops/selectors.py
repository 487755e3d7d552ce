"""Reads shared by the API, the admin and the dashboard."""

from __future__ import annotations

from typing import Any

from .exceptions import NotFound
from .models import Agent, Alert, HistoryRow


def agent_get(*, name: str) -> Agent:
    agent = Agent.objects.select_related("provider").filter(name=name, disposed_at__isnull=True).first()
    if agent is None:
        raise NotFound(f"no agent named {name!r}", data={"field": "name"})
    return agent


def history_row_out(row: HistoryRow) -> dict[str, Any]:
    return {
        "id": row.pk,
        "seq": row.seq,
        "participant": row.participant,
        "role": row.role,
        "content": row.content,
        "state": row.state,
        "set_aside_at": row.set_aside_at,
        "set_aside_reason": row.set_aside_reason,
        "created_at": row.created_at,
    }


def alert_out(alert: Alert) -> dict[str, Any]:
    """An alert with API.md's field names (instants as datetimes, for the API's schema)."""
    return {
        "id": alert.pk,
        "kind": alert.kind,
        "agent": alert.agent,
        "model": alert.model,
        "verdict": alert.verdict or None,
        "message": alert.message,
        "data": alert.data,
        "created_at": alert.created_at,
        "acknowledged_at": alert.acknowledged_at,
    }


def alert_json(alert: Alert) -> dict[str, Any]:
    """``alert_out`` as plain JSON (instants as ISO text): the one shape the dashboard's
    ``alert.raised`` event, its snapshot and the webhook body carry."""
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in alert_out(alert).items()}
