"""Compiling a request from an agent's presented history rows (architecture.md §5.1)."""

from __future__ import annotations

from collections.abc import Iterable
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
    return (
        row.role == HistoryRow.Role.SYSTEM_NOTE
        and isinstance(row.content, str)
        and row.content.startswith((TRIM_PREFIX, SUMMARY_PREFIX))
    )


def presented_order(rows: Iterable[HistoryRow]) -> list[HistoryRow]:
    """Rows (in sequence order) as a request presents them: the notes that stand for set-aside
    rows first, then the others in sequence order (a restored row is back in its place)."""
    rows = list(rows)
    return [r for r in rows if leads(r)] + [r for r in rows if not leads(r)]


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
    messages, those that stand for set-aside rows first (``presented_order``). ``rows``: in
    sequence order."""
    messages: list[Message] = []
    for row in presented_order(rows):
        if row.state != HistoryRow.State.PRESENTED:
            continue
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
