"""Compiling a request from an agent's presented history rows (architecture.md §5.1)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any, Final

from agentops.models import Agent, HistoryRow
from calls.types import CompiledRequest, Message

# The notes that stand for rows set aside to fit the model's window (architecture.md §5.9,
# ``turns.context``). They are written after the turn that needed the room, but stand where
# those rows were: a request carries them first, so the last thing the model reads is the
# turn's own message, never the note.
TRIM_PREFIX: Final = "[context-trim]"
SUMMARY_PREFIX: Final = "[context-summary]"


def leads(row: HistoryRow) -> bool:
    """Whether the row is a note that a request carries first, before the rest of the history."""
    return row.role == HistoryRow.Role.SYSTEM_NOTE and row.note_kind in (
        HistoryRow.NoteKind.TRIM,
        HistoryRow.NoteKind.SUMMARY,
    )


def presented_order(rows: Iterable[HistoryRow]) -> list[HistoryRow]:
    """Rows (in sequence order) as a request presents them: the notes that stand for set-aside
    rows first, then the others in sequence order (a restored row is back in its place)."""
    rows = list(rows)
    return [r for r in rows if leads(r)] + [r for r in rows if not leads(r)]


def notes_not_last(rows: list[HistoryRow]) -> list[HistoryRow]:
    """``rows`` (presented, as a request carries them) with the service's notes that would end
    the request moved to just before the newest participant's row: a model reads the last
    message as what to answer, and once answered the service's own ``[inference-failed]``
    note (architecture.md §5.8). Unchanged when no note ends them or no participant's row is
    among them (then nothing is left to answer: ``nothing_to_answer``)."""
    end = len(rows)
    while end and rows[end - 1].role == HistoryRow.Role.SYSTEM_NOTE:
        end -= 1
    at = next((i for i in range(end - 1, -1, -1) if rows[i].role == HistoryRow.Role.USER), None)
    if end == len(rows) or at is None:
        return rows
    return rows[:at] + rows[end:] + rows[at:end]


def nothing_to_answer(rows: list[HistoryRow], asked: Callable[[], Collection[int]] = tuple) -> bool:
    """Whether nothing in ``rows`` (presented, in sequence order) awaits the agent's answer:
    every row after its newest answer is one of the service's notes (or there is none), and no
    participant's row the turn was submitted for (``asked()``, row ids, read only then) is
    among them: one that joined while the previous call ran stands before that call's answer,
    yet awaits its own."""
    for row in reversed(rows):
        if row.role == HistoryRow.Role.ASSISTANT:
            break
        if row.role != HistoryRow.Role.SYSTEM_NOTE:
            return False
    ids = asked()
    return not any(r.pk in ids and r.role != HistoryRow.Role.SYSTEM_NOTE for r in rows)


def row_blocks(content: Any) -> list[dict[str, Any]]:
    """A row's content as blocks (a plain string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict) and "type" in b]


def compile_request(
    agent: Agent, rows: Iterable[HistoryRow], *, stream: bool | None = None
) -> CompiledRequest:
    """The agent's own rows become assistant messages; every other participant's rows become
    user messages whose text is labelled ``participant: text``; notes go in as they are, as user
    messages, those that stand for set-aside rows first (``presented_order``), and never last
    (``notes_not_last``). ``rows``: in sequence order."""
    messages: list[Message] = []
    presented = [r for r in rows if r.state == HistoryRow.State.PRESENTED]
    for row in notes_not_last(presented_order(presented)):
        blocks = row_blocks(row.content)
        if row.role == HistoryRow.Role.ASSISTANT:
            messages.append(Message(role="assistant", blocks=blocks))
        elif row.role == HistoryRow.Role.TOOL:
            messages.append(Message(role="user", blocks=blocks))
        elif row.role == HistoryRow.Role.SYSTEM_NOTE:
            messages.append(Message(role="user", blocks=blocks))
        else:
            labelled = [
                {"type": "text", "text": f"{row.participant}: {b['text']}"}
                if b["type"] == "text"
                else b
                for b in blocks
            ]
            messages.append(Message(role="user", blocks=labelled))
    return CompiledRequest(
        model=agent.model,
        system=agent.system,
        messages=messages,
        max_tokens=agent.max_tokens,
        stream=agent.stream if stream is None else stream,
        thinking_budget=agent.thinking_budget,
        tools=list(agent.tools or []),
    )
