"""Turn writes (architecture.md §5.1): every change of a turn's status goes through this module
or ``turns.moves``.

``TRANSITIONS`` lists the moves a turn may make; each service makes one of them with a
conditional update (``turn_move``) or under the row's lock (``turn_may_move``), so a turn that
moved meanwhile (cancelled while its call was out, claimed by another drain) is left as it is
and the service says so. Here: the API submits, answers tool calls and cancels, and the
breaker's retry after a shed queues a new turn; the drain's moves (claim, hold, hand back,
complete, re-arm, fail) are in ``turns.moves``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from types import SimpleNamespace
from typing import Any, Final

import redis
from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agentops import rows, telemetry
from agentops.cancels import abort_signal
from agentops.exceptions import BadRequest, Conflict, NotFound
from agentops.live import broadcast_turn_event
from agentops.models import Agent, AuditEntry, HistoryRow
from agentops.services import history_append
from breaker.services import breaker_probe_withdraw
from inference.models import Turn
from turns.queue import enqueue_drain
from turns.tracing import turn_event, turn_link, turn_trace_begin, turn_trace_end

logger = logging.getLogger(__name__)

Status = Turn.Status
# The most messages one turn carries, joined ones included (API.md, Turns: 409 past it).
TURN_MESSAGES_LIMIT: Final = 100

# The moves a turn may make: from each status, the statuses it may go to. An ended turn
# (succeeded, failed, exhausted, cancelled) never moves again.
TRANSITIONS: Final[dict[str, frozenset[str]]] = {
    # A drain claims it.
    Status.QUEUED: frozenset({Status.RUNNING, Status.CANCELLED}),
    # A drain claims it again once its wait is over or released; the admission check keeps it held.
    Status.HELD: frozenset({Status.RUNNING, Status.HELD, Status.CANCELLED}),
    # Claimed again (a dead worker's turn resumes), held by a wait, handed back or re-armed,
    # waiting for tool results, or ended.
    Status.RUNNING: frozenset(
        {
            Status.RUNNING,
            Status.HELD,
            Status.QUEUED,
            Status.REQUIRES_ACTION,
            Status.SUCCEEDED,
            Status.FAILED,
            Status.EXHAUSTED,
            Status.CANCELLED,
        }
    ),
    # The client's tool results queue its next round.
    Status.REQUIRES_ACTION: frozenset({Status.QUEUED, Status.CANCELLED}),
}


def sources(to: str, *, among: Iterable[str] | None = None) -> list[str]:
    """The statuses a turn may move to ``to`` from (``among`` narrows them for one service).
    Raises ValueError for a move the table does not allow: a service asking for one is a bug."""
    allowed = [status for status, targets in TRANSITIONS.items() if to in targets]
    if among is None:
        return allowed
    wanted = list(among)
    if not set(wanted) <= set(allowed):
        raise ValueError(f"a turn may not move from {sorted(set(wanted) - set(allowed))} to {to}")
    return wanted


def turn_move(turn_id: int, to: str, *, among: Iterable[str] | None = None, **fields: Any) -> bool:
    """Move the turn to ``to`` if it is in one of ``sources(to, among=among)``; True if it moved.
    A hold's until and reason belong to a held turn: a move anywhere else clears them, so a
    queued turn shows no stale hold reason."""
    if to != Status.HELD:
        fields.setdefault("hold_until", None)
        fields.setdefault("hold_reason", "")
    return bool(
        Turn.objects.filter(pk=turn_id, status__in=sources(to, among=among)).update(
            status=to, **fields
        )
    )


def turn_may_move(turn: Turn, to: str) -> bool:
    """For a turn row locked with ``select_for_update``: whether it may move to ``to`` now."""
    return turn.status in sources(to)


def turn_announce(turn_id: int, status: str, **extra: Any) -> None:
    broadcast_turn_event(
        turn_id, {"type": "turn.status", "turn": turn_id, "status": status, **extra}
    )
    if status in Turn.ENDED:
        broadcast_turn_event(turn_id, {"type": "turn.ended", "turn": turn_id, "status": status})


def cancel_key(turn: Turn) -> str:
    """A Redis key a running call watches: set when its turn is cancelled. It names the turn's
    creation instant too, so a key left from a database that was since reset matches nothing."""
    return f"agentops:turn-cancel:{turn.pk}:{turn.created_at.timestamp():.6f}"


def _signal_cancel(turn: Turn) -> None:
    try:
        abort_signal(settings.REDIS_URL, cancel_key(turn))
    except redis.RedisError:
        # The drain also re-reads the turn's status after the call; this only speeds it up.
        logger.warning(
            "turn %s: could not signal the cancel to its running call", turn.pk, exc_info=True
        )


# --- the API's writes ------------------------------------------------------------------------


@dataclass(frozen=True)
class IncomingMessage:
    participant: str
    content: Any


def turn_submit(*, agent_id: int, messages: list[IncomingMessage]) -> tuple[Turn, bool]:
    """Store the messages as presented rows and queue a turn, or join the agent's queued or
    held turn. Returns (turn, joined)."""
    sql = _submit_sql()
    with transaction.atomic():
        agents = rows.instances(sql.agent, [agent_id], Agent)
        if not agents:
            raise NotFound("agent not found")
        agent = agents[0]
        joinable = rows.instances(sql.joinable, [agent_id, [str(s) for s in Turn.JOINABLE]], Turn)
        turn = joinable[0] if joinable else None
        joined = turn is not None
        if turn is not None:
            # A turn's prompt grows with every join: at most TURN_MESSAGES_LIMIT in all.
            held = turn.trigger_rows.count()
            if held + len(messages) > TURN_MESSAGES_LIMIT:
                raise Conflict(
                    f"messages: turn {turn.pk} already has {held} message(s); "
                    f"joining {len(messages)} more would pass "
                    f"the limit of {TURN_MESSAGES_LIMIT} per turn "
                    "(wait for it to start, then submit a new turn)",
                    data={
                        "field": "messages",
                        "turn": turn.pk,
                        "count": held,
                        "adding": len(messages),
                        "limit": TURN_MESSAGES_LIMIT,
                    },
                )
        added = [
            history_append(
                agent=agent, participant=m.participant, role=HistoryRow.Role.USER, content=m.content
            )
            for m in messages
        ]
        if turn is None:
            turn = rows.insert(
                Turn(agent=agent, status=Status.QUEUED, trace_context=turn_trace_begin(agent))
            )
            turn_announce(turn.pk, turn.status)
        elif telemetry.enabled:
            Turn.objects.filter(pk=turn.pk).update(
                **turn_link()
            )  # the joining request, linked from the turn's span
        with connection.cursor() as cursor:
            cursor.executemany(sql.trigger, [(turn.pk, row.pk) for row in added])
        if turn.status == Status.QUEUED:
            enqueue_drain(agent.pk)
    return turn, joined


@cache
def _submit_sql() -> SimpleNamespace:
    """``turn_submit``'s statements, hand-written (``agentops.rows``): every submit makes them."""
    through = Turn.trigger_rows.through._meta
    turn_column, row_column = (
        through.get_field(name).column  # type: ignore[union-attr]
        for name in ("turn", "historyrow")
    )
    return SimpleNamespace(
        agent=(
            f"SELECT {rows.columns(Agent, 'a')} FROM {Agent._meta.db_table} a "
            "WHERE a.id = %s AND a.disposed_at IS NULL FOR UPDATE"
        ),
        joinable=(
            f"SELECT {rows.columns(Turn, 't')} FROM {Turn._meta.db_table} t "
            "WHERE t.agent_id = %s AND t.status = ANY(%s) ORDER BY t.id LIMIT 1"
        ),
        # As ``trigger_rows.add``: a row already there is left as it is.
        trigger=(
            f"INSERT INTO {through.db_table} ({turn_column}, {row_column}) "
            "VALUES (%s, %s) ON CONFLICT DO NOTHING"
        ),
    )


def turn_tool_results(*, turn_id: int, results: list[dict[str, Any]]) -> Turn:
    """Store tool results for a turn in ``requires_action`` and queue its next round.

    Every pending tool call must get exactly one result."""
    with transaction.atomic():
        turn = Turn.objects.select_for_update().select_related("agent").filter(pk=turn_id).first()
        if turn is None:
            raise NotFound("turn not found")
        if turn.status != Status.REQUIRES_ACTION:
            raise Conflict(f"turn {turn_id} is {turn.status}, not requires_action")
        pending = [c["id"] for c in turn.pending_tool_calls]
        given = [r["tool_call_id"] for r in results]
        unknown = [g for g in given if g not in pending]
        if unknown:
            raise BadRequest(
                f"results.tool_call_id: {unknown[0]!r} is not a pending tool call of this turn",
                data={"field": "results.tool_call_id"},
            )
        if len(set(given)) != len(given):
            raise BadRequest(
                "results.tool_call_id: each tool call takes one result",
                data={"field": "results.tool_call_id"},
            )
        missing = [p for p in pending if p not in given]
        if missing:
            raise BadRequest(
                f"results: missing a result for tool call {missing[0]!r}", data={"field": "results"}
            )
        agent = Agent.objects.select_for_update().get(pk=turn.agent_id)
        blocks = [
            {"type": "tool_result", "tool_call_id": r["tool_call_id"], "content": r["content"]}
            for r in results
        ]
        row = history_append(
            agent=agent, participant="tool", role=HistoryRow.Role.TOOL, content=blocks
        )
        turn.trigger_rows.add(row)
        turn_move(
            turn.pk,
            Status.QUEUED,
            among=[Status.REQUIRES_ACTION],
            pending_tool_calls=[],
            **turn_link(),
        )  # locked: it moves
        turn.status, turn.pending_tool_calls = Status.QUEUED, []
        turn_announce(turn.pk, turn.status)
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
        if not turn_may_move(turn, Status.CANCELLED):
            raise Conflict(f"turn {turn_id} already ended ({turn.status})")
        turn_move(turn.pk, Status.CANCELLED, ended_at=now)  # locked: it moves
        turn.status, turn.ended_at = Status.CANCELLED, now
        turn_announce(turn.pk, turn.status)
        turn_trace_end(turn, status=Status.CANCELLED)
        transaction.on_commit(lambda: _signal_cancel(turn))
        # The agent's next queued turn may now run.
        enqueue_drain(turn.agent_id)
    return turn


def agent_dispose(*, agent: Agent, actor: str) -> None:
    """Dispose a conversation or ephemeral agent: it takes no more turns and its open turns
    are cancelled. Its rows stay (history is never deleted) and so does its name."""
    if agent.kind == Agent.Kind.RESIDENT:
        raise Conflict(
            "a resident agent cannot be disposed; only conversation and ephemeral agents can"
        )
    now = timezone.now()
    with transaction.atomic():
        if not Agent.objects.filter(pk=agent.pk, disposed_at__isnull=True).update(disposed_at=now):
            raise NotFound(f"no agent named {agent.name!r}")
        open_turns = list(Turn.objects.filter(agent=agent, status__in=Turn.OPEN))
        Turn.objects.filter(
            pk__in=[t.pk for t in open_turns], status__in=sources(Status.CANCELLED)
        ).update(status=Status.CANCELLED, ended_at=now)
        for turn in open_turns:
            turn_trace_end(turn, agent=agent, status=Status.CANCELLED)
        AuditEntry.objects.create(actor=actor, action="agent.dispose", target=f"agent:{agent.name}")
        # A probe still out is withdrawn (architecture.md §7.3): its answer is set aside and its
        # call aborted.
        breaker_probe_withdraw(agent=agent, reason="the agent was removed while it was out")
    for turn in open_turns:
        _signal_cancel(turn)


# --- the breaker's retry ---------------------------------------------------------------------


def turn_queue_retry(*, agent: Agent, set_aside: list[int] | None = None) -> None:
    """Queue one retry after a shed (architecture.md §7.4): a new turn over the history with the
    newest turn set aside, unless one is already queued or held (it will run over that history too).
    ``set_aside``: the sequence numbers of the rows the shed set aside (an event of the retry's
    span). Call inside the shed's transaction, so both commit or neither."""
    Agent.objects.select_for_update().get(pk=agent.pk)
    event = ("agentops.turn.set_aside", {"agentops.history.set_aside": set_aside or []})
    waiting = Turn.objects.filter(agent=agent, status__in=Turn.JOINABLE).order_by("id").first()
    if waiting is None:
        # The retry's span starts under the context here: the failed turn's, or its probe's.
        stored = turn_trace_begin(agent)
        if stored is not None:
            stored["events"].append(telemetry.stored_event(*event))
        retry = Turn.objects.create(agent=agent, status=Status.QUEUED, trace_context=stored)
        turn_announce(retry.pk, retry.status)
    elif telemetry.enabled:
        Turn.objects.filter(pk=waiting.pk).update(**turn_event(*event))
    enqueue_drain(agent.pk)
