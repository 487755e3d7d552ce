"""What operators see of an agent's window (architecture.md §5.9): ``context`` on
``GET /agents/{name}`` and the agent's admin page."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agentops.models import Agent
from inference.models import InferenceCall


def last_input_tokens(agent_ids: Iterable[int]) -> dict[int, int]:
    """Each agent's last primary call's reported input tokens (one statement for the lot)."""
    ids = list(agent_ids)
    if not ids:
        return {}
    found = (
        InferenceCall.objects.filter(
            agent_id__in=ids, kind=InferenceCall.Kind.PRIMARY, input_tokens__isnull=False
        )
        .order_by("agent_id", "-id")
        .distinct("agent_id")
        .values_list("agent_id", "input_tokens")
    )
    return {agent_id: int(tokens or 0) for agent_id, tokens in found}


def context_out(agent: Agent, last_input: int | None) -> dict[str, Any]:
    """``{window, learned, last_input_tokens, used_fraction, policy}``; ``used_fraction`` is the
    last call's input over the known window (the smaller of configured and learned)."""
    window = agent.known_window
    return {
        "window": agent.context_window,
        "learned": agent.context_learned_window,
        "last_input_tokens": last_input,
        "used_fraction": round(last_input / window, 4) if window and last_input else None,
        "policy": agent.context_policy,
    }
