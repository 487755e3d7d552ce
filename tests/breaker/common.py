"""Helpers shared by the breaker's service tests (real Postgres, no worker)."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from agentops.models import Agent, HistoryRow
from agentops.services import history_append
from breaker.models import BreakerState
from breaker.probes import ProbeEnd, ProbeTicket, breaker_probe_begin, breaker_probe_end
from breaker.services import breaker_note_failure
from inference.models import Turn
from tests.factories import TurnFactory

SHED_REASON = "invalid_request at HTTP 400"


def fail(agent: Agent, failure_type: str = "invalid_request", status: int | None = 400) -> Any:
    return breaker_note_failure(agent=agent, failure_type=failure_type, http_status=status)


def row(
    agent: Agent,
    role: str = HistoryRow.Role.USER,
    content: Any = "hello",
    participant: str = "alice",
) -> HistoryRow:
    with transaction.atomic():
        Agent.objects.select_for_update().get(pk=agent.pk)
        return history_append(agent=agent, participant=participant, role=role, content=content)


def state(agent: Agent) -> BreakerState:
    return BreakerState.objects.get(agent=agent)


def probe_out(agent: Agent) -> ProbeTicket:
    """Two rows, three sheddable failures, and the probe out."""
    row(agent, content="one")
    row(agent, HistoryRow.Role.ASSISTANT, "two", participant=agent.participant)
    TurnFactory.create(agent=agent, status=Turn.Status.FAILED, attempts=1)  # the failed turn
    for _ in range(3):
        fail(agent)
    return breaker_probe_begin(agent=agent)


def end(ticket: ProbeTicket, verdict: Any, detail: str = "ok") -> ProbeEnd:
    return breaker_probe_end(ticket=ticket, verdict=verdict, detail=detail, shed_reason=SHED_REASON)
