"""A turn's span, ``agentops.turn``, from its submit to its end across processes
(architecture.md §16, docs/observability.md).

The submit starts it under the request's context and stores it on the turn's row
(``turn_trace_begin``, ``agentops.telemetry.span_stored``). What happens to the turn on the way
becomes an event of it, appended to the row by the very statement that makes the change
(``turn_event``: held, released, resumed, paced, re-armed, set aside, taken over, handed back),
and a request that joins the turn (more messages, tool results) a link (``turn_link``). Every
process that works on the turn runs it under the stored span (``turn_traced``), so its attempts
are the span's children and its log lines carry the turn's trace, whichever worker runs it,
after a crash too. Whichever process ends the turn re-creates the span from the row, with its
ids, start, events and links, and ends it once the end has committed (``turn_trace_end``).

A turn that never ends (waiting forever for tool results, held until a release that never
comes) is never exported; its attempts are, under its ids. With telemetry off every function
here does nothing and the row's ``trace_context`` stays null.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, Final

from django.db.models.expressions import RawSQL

from agentops import telemetry
from agentops.models import Agent
from agentops.rows import after_commit
from calls.tracing import project_name
from inference.models import Turn

SPAN_NAME: Final = "agentops.turn"

# Append to one of the stored span's lists (events, links) in the UPDATE that changes the turn,
# up to its limit; a turn stored with no span (telemetry was off at its submit) stays null.
_APPEND_SQL = (
    "CASE WHEN trace_context IS NULL "
    "OR jsonb_array_length(COALESCE(trace_context->'{key}', '[]'::jsonb)) >= %s "
    "THEN trace_context "
    "ELSE jsonb_set(trace_context, '{{{key}}}', "
    "COALESCE(trace_context->'{key}', '[]'::jsonb) || %s::jsonb) END"
)


def turn_trace_begin(agent: Agent) -> dict[str, Any] | None:
    """The new turn's span, started under the current context (the submitting request's), as
    its row stores it; None when nothing is exported."""
    return telemetry.span_stored(SPAN_NAME, attributes={"agentops.agent": agent.name})


def turn_event(name: str, attributes: dict[str, Any]) -> dict[str, Any]:
    """The fields that append the event ``name`` to the turn's span, for the ``update()`` that
    makes the change it records: ``{}`` when nothing is exported."""
    if not telemetry.enabled:
        return {}
    event = telemetry.stored_event(name, attributes)
    return {
        "trace_context": RawSQL(
            _APPEND_SQL.format(key="events"), (telemetry.STORED_EVENTS_LIMIT, json.dumps([event]))
        )
    }


def turn_link() -> dict[str, Any]:
    """The fields that link the turn's span to the current span (a request that joined the
    turn), for an ``update()`` of the turn: ``{}`` when nothing is exported or no span is
    current."""
    link = telemetry.stored_link() if telemetry.enabled else None
    if link is None:
        return {}
    return {
        "trace_context": RawSQL(
            _APPEND_SQL.format(key="links"), (telemetry.STORED_LINKS_LIMIT, json.dumps([link]))
        )
    }


def turn_noted(turn_id: int, name: str, attributes: dict[str, Any]) -> None:
    """Append an event to the turn's span on its own (where no change of the row carries it)."""
    if telemetry.enabled:
        Turn.objects.filter(pk=turn_id).update(**turn_event(name, attributes))


@contextmanager
def turn_traced(turn: Turn) -> Iterator[None]:
    """Run the block under the turn's span: its attempts are its children, its log lines carry
    its ids."""
    with telemetry.current(telemetry.stored_context(turn.trace_context)):
        yield


def turn_trace_end(
    turn: Turn,
    *,
    status: str,
    agent: Agent | None = None,
    error_type: str | None = None,
    message: str = "",
) -> None:
    """Once the transaction that ends the turn commits (at once outside one): re-create the
    turn's span from ``turn.trace_context`` (read in that transaction) and end it. ``agent``:
    the turn's, when the caller has it loaded."""
    if not telemetry.enabled or turn.trace_context is None:
        return
    stored = turn.trace_context
    agent = agent or turn.agent
    attributes = {
        "agentops.turn.id": turn.pk,
        "agentops.agent": agent.name,
        "agentops.project": project_name(agent.project_id),
        "agentops.turn.status": status,
        "agentops.turn.attempts": turn.attempts,
        "agentops.turn.rounds": turn.rounds,
        "agentops.turn.rearms": turn.rearms,
    }
    after_commit(
        lambda: telemetry.stored_span_end(
            stored, SPAN_NAME, attributes=attributes, error_type=error_type, message=message
        )
    )


def held_since_ns(turn: Turn) -> int | None:
    """When the turn's current hold began, by its span's last ``held`` event (None: unknown)."""
    events = (turn.trace_context or {}).get("events") or []
    return next((int(at) for name, at, _ in reversed(events) if name == "agentops.turn.held"), None)


@cache
def _held_duration() -> Any:
    return telemetry.meter().create_histogram(
        "agentops.turn.held.duration",
        unit="s",
        description=(
            "How long a turn was held by a provider wait before it ran again "
            "(architecture.md §6.6)."
        ),
        explicit_bucket_boundaries_advisory=HELD_BUCKETS,
    )


# Holds last from seconds (pacing) to hours (a wait until released).
HELD_BUCKETS: Final = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400)


def turn_held_recorded(agent: Agent, held_s: float) -> None:
    """Record how long a turn of ``agent`` was held (it runs again now)."""
    if telemetry.enabled:
        _held_duration().record(
            held_s, {"agentops.agent": agent.name, "gen_ai.request.model": agent.model}
        )
