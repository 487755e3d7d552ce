"""Enqueueing an agent's drain (``inference.tasks.agent_drain``), by task name: the tasks
module imports the drain, so nothing here imports the tasks module."""

from __future__ import annotations

from agentops import telemetry
from agentops.celery import task_send
from agentops.rows import after_commit
from inference.models import Turn
from turns.tracing import turn_event

AGENT_DRAIN = "inference.tasks.agent_drain"


def enqueue_drain(agent_id: int) -> None:
    """Drain the agent once the current transaction commits (at once outside one)."""
    after_commit(lambda: task_send(AGENT_DRAIN, agent_id))


def schedule_drain(agent_id: int, delay_s: float) -> None:
    """Drain the agent again after ``delay_s``. The countdown never exceeds half the broker's
    visibility timeout; the beat sweep picks up anything later."""
    after_commit(lambda: task_send(AGENT_DRAIN, agent_id, countdown_s=delay_s))


def held_turns_wake(
    *, agent: str | None = None, model: str | None = None, by: str = "", provider: str = ""
) -> int:
    """After a release: re-check the named agent's held turns (or, with ``provider``, every
    agent's on that provider) now rather than at the next sweep (the release itself lives in
    waits, below turns, and knows nothing of them), and note the release on their spans
    (``model``, ``by``: what was released, by whom). Returns how many agents were woken."""
    held = Turn.objects.filter(status=Turn.Status.HELD)
    held = (
        held.filter(agent__provider__name=provider) if provider else held.filter(agent__name=agent)
    )
    if telemetry.enabled:
        held.update(
            **turn_event(
                "agentops.turn.released",
                {"agentops.wait.model": model or "*", "agentops.release.by": by},
            )
        )
    agent_ids = set(held.values_list("agent_id", flat=True))
    for agent_id in agent_ids:
        enqueue_drain(agent_id)  # its admission check reads the journal fresh: it sees the release
    return len(agent_ids)
