"""Compiling a request from an agent's presented history rows (architecture.md §5.1)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentops.models import Agent, HistoryRow
from calls.types import CompiledRequest, Message


def row_blocks(content: Any) -> list[dict[str, Any]]:
    """A row's content as blocks (a plain string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, dict) and "type" in b]


def compile_request(
    agent: Agent, rows: Iterable[HistoryRow], *, stream: bool | None = None
) -> CompiledRequest:
    """The agent's own rows become assistant messages; every other participant's rows become
    user messages whose text is labelled ``participant: text``; notes go in as they are."""
    messages: list[Message] = []
    for row in rows:
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
