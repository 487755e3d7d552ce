"""Reads shared by the API, the admin and the dashboard."""

from __future__ import annotations

from typing import Any

from .exceptions import NotFound
from .models import Agent, HistoryRow


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
