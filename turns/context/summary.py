"""The ``summarize`` policy's one auxiliary call (architecture.md §5.9): the agent's own model
asked to summarize the rows about to be set aside. Its call row and tokens are recorded as
every auxiliary call's; any failure gives None, and the caller trims instead."""

from __future__ import annotations

import json
import logging
from typing import Final

from agentops.exceptions import AgentopsError
from agentops.models import Agent
from calls.engine import CallRuntime
from turns.auxiliary import AuxMessage, auxiliary_complete_on_loop
from turns.context.estimate import CHARS_PER_TOKEN
from turns.context.selection import Row

logger = logging.getLogger(__name__)

SUMMARY_MAX_TOKENS: Final = 1024
SUMMARY_CHARS: Final = 2000  # what of the summary goes into the note
INSTRUCTION: Final = (
    "Summarize the conversation rows below for the agent that took part in them, so it can go "
    "on without them: who asked what, what was decided or done, tool results that still "
    "matter, and anything still owed. Plain prose, at most a few paragraphs."
)


def _rendered(rows: list[Row], limit_chars: int) -> str:
    lines = []
    for row in rows:
        text = row.content if isinstance(row.content, str) else json.dumps(row.content)
        lines.append(f"[{row.seq}] {row.participant} ({row.role}): {text}")
    body = "\n".join(lines)
    # The summary request must fit the window too: its oldest part is cut when it would not.
    return body if len(body) <= limit_chars else body[-limit_chars:]


async def context_summary(
    rt: CallRuntime, *, agent: Agent, rows: list[Row], budget_tokens: int
) -> str | None:
    """The summary text (an auxiliary call through ``rt``), or None when the call failed, was
    held or answered nothing."""
    content = f"{INSTRUCTION}\n\n{_rendered(rows, max(budget_tokens, 256) * CHARS_PER_TOKEN)}"
    try:
        done = await auxiliary_complete_on_loop(
            rt,
            agent=agent,
            messages=[AuxMessage(participant="agentops", content=content)],
            model=None,
            max_tokens=min(agent.max_tokens or SUMMARY_MAX_TOKENS, SUMMARY_MAX_TOKENS),
        )
    except AgentopsError as exc:
        logger.warning(
            "agent %s: the context summary failed (%s); trimming instead", agent.name, exc
        )
        return None
    text = str(done.get("content") or "").strip()
    return text[:SUMMARY_CHARS] or None
