"""Turn writes: submit (with join), tool results, cancel, and the runner's transitions."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from agentops.celery import task_countdown_s
from agentops.exceptions import BadRequest, Conflict, NotFound
from agentops.live import broadcast_turn_event
from agentops.models import Agent, AuditEntry, HistoryRow

from .models import Turn

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class IncomingMessage:
    participant: str
    content: Any


def history_append(*, agent: Agent, participant: str, role: str, content: Any) -> HistoryRow:
    """Append one row at the next sequence number. Call inside a transaction that holds the
    agent's row lock (``Agent.objects.select_for_update()``), so two writers never collide."""
    last = HistoryRow.objects.filter(agent=agent).aggregate(m=Max("seq"))["m"] or 0
    return HistoryRow.objects.create(agent=agent, seq=last + 1, participant=participant, role=role, content=content)


def cancel_key(turn: Turn) -> str:
    """A Redis key a running call polls: set when its turn is cancelled. It names the turn's
    creation instant too, so a key left from a database that was since reset matches nothing."""
    return f"agentops:turn-cancel:{turn.pk}:{turn.created_at.timestamp():.6f}"


def _signal_cancel(turn: Turn) -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.set(cancel_key(turn), "1", ex=3600)
    except redis.RedisError:
        # The runner also re-reads the turn's status after the call; this only speeds it up.
        logger.warning("turn %s: could not signal the cancel to its running call", turn.pk, exc_info=True)
    finally:
        client.close()


def enqueue_drain(agent_id: int) -> None:
    from .tasks import agent_drain

    transaction.on_commit(lambda: agent_drain.delay(agent_id))


def schedule_drain(agent_id: int, delay_s: float) -> None:
    """Drain the agent again after ``delay_s``. The countdown never exceeds half the broker's
    visibility timeout; the beat sweep picks up anything later."""
    from .tasks import agent_drain

    countdown = task_countdown_s(delay_s)
    transaction.on_commit(lambda: agent_drain.apply_async((agent_id,), countdown=countdown))


def turn_submit(*, agent_id: int, messages: list[IncomingMessage]) -> tuple[Turn, bool]:
    """Store the messages as presented rows and queue a turn, or join the agent's queued or
    held turn. Returns (turn, joined)."""
    with transaction.atomic():
        agent = Agent.objects.select_for_update().filter(pk=agent_id, disposed_at__isnull=True).first()
        if agent is None:
            raise NotFound("agent not found")
        rows = [
            history_append(agent=agent, participant=m.participant, role=HistoryRow.Role.USER, content=m.content)
            for m in messages
        ]
        turn = Turn.objects.filter(agent=agent, status__in=Turn.JOINABLE).order_by("id").first()
        joined = turn is not None
        if turn is None:
            turn = Turn.objects.create(agent=agent, status=Turn.Status.QUEUED)
            broadcast_turn_event(turn.pk, {"type": "turn.status", "turn": turn.pk, "status": turn.status})
        turn.trigger_rows.add(*rows)
        if turn.status == Turn.Status.QUEUED:
            enqueue_drain(agent.pk)
    return turn, joined


def turn_tool_results(*, turn_id: int, results: list[dict[str, Any]]) -> Turn:
    """Store tool results for a turn in ``requires_action`` and queue its next round.

    Every pending tool call must get exactly one result."""
    with transaction.atomic():
        turn = Turn.objects.select_for_update().select_related("agent").filter(pk=turn_id).first()
        if turn is None:
            raise NotFound("turn not found")
        if turn.status != Turn.Status.REQUIRES_ACTION:
            raise Conflict(f"turn {turn_id} is {turn.status}, not requires_action")
        pending = [c["id"] for c in turn.pending_tool_calls]
        given = [r["tool_call_id"] for r in results]
        unknown = [g for g in given if g not in pending]
        if unknown:
            raise BadRequest(f"results.tool_call_id: {unknown[0]!r} is not a pending tool call of this turn", data={"field": "results.tool_call_id"})
        if len(set(given)) != len(given):
            raise BadRequest("results.tool_call_id: each tool call takes one result", data={"field": "results.tool_call_id"})
        missing = [p for p in pending if p not in given]
        if missing:
            raise BadRequest(f"results: missing a result for tool call {missing[0]!r}", data={"field": "results"})
        agent = Agent.objects.select_for_update().get(pk=turn.agent_id)
        blocks = [{"type": "tool_result", "tool_call_id": r["tool_call_id"], "content": r["content"]} for r in results]
        row = history_append(agent=agent, participant="tool", role=HistoryRow.Role.TOOL, content=blocks)
        turn.trigger_rows.add(row)
        turn.status = Turn.Status.QUEUED
        turn.pending_tool_calls = []
        turn.save(update_fields=["status", "pending_tool_calls"])
        broadcast_turn_event(turn.pk, {"type": "turn.status", "turn": turn.pk, "status": turn.status})
        enqueue_drain(agent.pk)
    return turn


def turn_cancel(*, turn_id: int) -> Turn:
    """Cancel an open turn. A running call notices within a fraction of a second and is
    aborted; a cancel is never turned into a retry. Cancelling an ended turn is a 409."""
    now = timezone.now()
    with transaction.atomic():
        turn = Turn.objects.select_for_update().filter(pk=turn_id).first()
        if turn is None:
            raise NotFound("turn not found")
        if turn.status in Turn.ENDED:
            raise Conflict(f"turn {turn_id} already ended ({turn.status})")
        turn.status = Turn.Status.CANCELLED
        turn.ended_at = now
        turn.save(update_fields=["status", "ended_at"])
        broadcast_turn_event(turn.pk, {"type": "turn.status", "turn": turn.pk, "status": turn.status})
        broadcast_turn_event(turn.pk, {"type": "turn.ended", "turn": turn.pk, "status": turn.status})
        transaction.on_commit(lambda: _signal_cancel(turn))
        # The agent's next queued turn may now run.
        enqueue_drain(turn.agent_id)
    return turn


def agent_dispose(*, agent: Agent, actor: str) -> None:
    """Dispose a conversation or ephemeral agent: it takes no more turns and its open turns
    are cancelled. Its rows stay (history is never deleted) and so does its name."""
    if agent.kind == Agent.Kind.RESIDENT:
        raise Conflict("a resident agent cannot be disposed; only conversation and ephemeral agents can")
    now = timezone.now()
    with transaction.atomic():
        if not Agent.objects.filter(pk=agent.pk, disposed_at__isnull=True).update(disposed_at=now):
            raise NotFound(f"no agent named {agent.name!r}")
        open_turns = list(Turn.objects.filter(agent=agent, status__in=Turn.OPEN))
        Turn.objects.filter(pk__in=[t.pk for t in open_turns]).update(status=Turn.Status.CANCELLED, ended_at=now)
        AuditEntry.objects.create(actor=actor, action="agent.dispose", target=f"agent:{agent.name}")
        # A probe still out is withdrawn (DESIGN §7.3): its answer is set aside and its call
        # aborted. Imported here: the breaker sits above this module (it appends history).
        from breaker.services import breaker_probe_withdraw

        breaker_probe_withdraw(agent=agent, reason="the agent was removed while it was out")
    for turn in open_turns:
        _signal_cancel(turn)


def held_turns_wake(*, agent: str) -> int:
    """After a release: re-check the named agent's held turns now rather than at the next
    sweep (the release itself lives in waits, below turns, and knows nothing of them).
    Returns how many agents were woken."""
    agent_ids = set(
        Turn.objects.filter(agent__name=agent, status=Turn.Status.HELD).values_list("agent_id", flat=True)
    )
    from waits.journal import JOURNAL_POLL_MS

    from .tasks import agent_drain

    for agent_id in agent_ids:
        enqueue_drain(agent_id)
        # A worker sees another process's release at its next journal poll: look again then.
        transaction.on_commit(lambda agent_id=agent_id: agent_drain.apply_async((agent_id,), countdown=JOURNAL_POLL_MS / 1000 + 0.2))  # type: ignore[misc]
    return len(agent_ids)
