"""The breaker's reads (API.md "Breaker and alerts")."""

from __future__ import annotations

from typing import Any

from django.conf import settings

from agentops.models import Agent, HistoryRow
from agentops.selectors import history_row_out

from .models import BreakerState


def breaker_out(*, agent: Agent) -> dict[str, Any]:
    """``{streak, threshold, sheds_this_run, shed_cap, probe, set_aside}`` for the agent; an
    agent that never failed reads as a zero streak with no probe."""
    state = BreakerState.objects.filter(agent_id=agent.pk).first()
    probe = None
    if state is not None and state.probe_status:
        probe = {
            "status": state.probe_status,
            "sent_at": state.probe_sent_at,
            "verdict": state.probe_verdict or None,
        }
    rows = HistoryRow.objects.filter(agent=agent, state=HistoryRow.State.SET_ASIDE).order_by("seq")
    return {
        "streak": state.streak if state else 0,
        "threshold": int(settings.AGENTOPS_BREAKER_THRESHOLD),
        "sheds_this_run": state.sheds_this_run if state else 0,
        "shed_cap": int(settings.AGENTOPS_BREAKER_SHED_CAP),
        "probe": probe,
        "set_aside": [history_row_out(r) for r in rows],
    }
