"""An agent's targets (architecture.md §6.11, §6.15): its own provider and model, its pool's
members and its alternates, read from the agent alone; the target a call is served by
(``Serving``), and the request made for it. The one reader of an agent's stored targets.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from django.conf import settings

from agentops.models import Agent, Provider
from calls.types import CompiledRequest
from turns.routing import Choice, alternates

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """A provider and model that serves a call (its provider loaded)."""

    provider: Provider
    model: str
    context_window: int | None = None


@dataclass(frozen=True)
class Candidate:
    """A target as routing reads it: the provider by id (loaded only once chosen)."""

    provider_id: int
    provider_name: str
    kind: str
    model: str
    context_window: int | None = None
    weight: int = 1  # a pool member's (§6.15)


@dataclass(frozen=True)
class Serving:
    """The target chosen for a call and why; ``previous``: the target of the agent's latest
    ended call among its targets (None: none yet); ``primary_until``: the primary's hold."""

    target: Target
    choice: Choice
    previous: int | None = None
    primary_until: int | None = None
    primary_held: bool = False
    # With a pool (§6.15): which member serves (0: the agent's own), when ``choice.index`` is 0,
    # and the other members that may serve, in the order to try them if its quota has no room.
    member: int = 0
    spares: tuple[Target, ...] = ()
    # A return to the primary after an alternate served, while an alternate is free to take
    # the request if the primary stays silent (its first content is bounded short).
    returning: bool = False

    @property
    def on_alternate(self) -> bool:
        return self.choice.index > 0

    @property
    def first_content_bound(self) -> tuple[float, str] | None:
        """The before-content bound of this call when shorter than the configured one: a
        return attempt's (§6.11), so a silent primary costs that once per interval."""
        if not self.returning:
            return None
        return (
            float(settings.AGENTOPS_FALLBACK_RETURN_FIRST_CONTENT_MS),
            "AGENTOPS_FALLBACK_RETURN_FIRST_CONTENT_MS",
        )


def wait_provider(agent: Agent, provider: Provider) -> str:
    """How the journal names the provider a wait binds on: "" for the agent's own (as in
    every wait recorded before alternates existed), else its name (§6.11)."""
    return "" if provider.pk == agent.provider_id else provider.name


def routed(agent: Agent) -> bool:
    """Whether the agent's calls have a choice to make: a pool or alternates (§6.11, §6.15)."""
    return bool(alternates(agent.pool) or alternates(agent.fallbacks))


def primary_serving(agent: Agent) -> Serving:
    return Serving(Target(agent.provider, agent.model), Choice(0))


def agent_candidates(agent: Agent, *, kind: str | None = None) -> tuple[list[Candidate], int]:
    """The agent's own provider and model, its pool's members, then its alternates (with
    ``kind``, those of that wire format: a drop-in request's body is in its own), and how many
    of them are the pool (the agent's own counts: at least 1). Stored targets carry their
    provider's id and kind, so this reads nothing; an entry without them (written by hand) is
    looked up by name."""
    primary = agent.provider
    candidates = [Candidate(primary.pk, primary.name, primary.kind, agent.model)]
    members = alternates(agent.pool)
    listed = alternates(agent.fallbacks)
    missing = {str(f.get("provider")) for f in (*members, *listed) if "provider_id" not in f}
    found = {
        p.name: (p.pk, p.kind)
        for p in (Provider.objects.filter(name__in=missing) if missing else ())
    }
    pooled = 1
    for index, entry in enumerate((*members, *listed)):
        name = str(entry.get("provider"))
        ref = (
            (entry["provider_id"], entry.get("kind")) if "provider_id" in entry else found.get(name)
        )
        if ref is None:
            logger.warning("agent %s: target provider %r does not exist; skipped", agent.name, name)
            continue
        if kind is None or ref[1] == kind:
            candidates.append(
                Candidate(
                    ref[0],
                    name,
                    str(ref[1]),
                    str(entry["model"]),
                    entry.get("context_window"),
                    weight=int(entry.get("weight") or 1),
                )
            )
            pooled += index < len(members)
    return candidates, pooled


def target_window(agent: Agent, target: tuple[int, str]) -> int | None:
    """The known window of one of the agent's targets (the agent's own: configured or
    learned; another: its entry's ``context_window``)."""
    if target == (agent.provider_id, agent.model):
        return agent.known_window
    candidates, _ = agent_candidates(agent)
    for candidate in candidates[1:]:
        if (candidate.provider_id, candidate.model) == target:
            return candidate.context_window
    return None


def request_for(
    request: CompiledRequest, agent: Agent, target: Target
) -> tuple[CompiledRequest, str]:
    """The request compiled for the agent, made for ``target``: its model, and for another
    provider without what only the agent's own provider can read back (thinking blocks carry
    its signatures). Returns the request and what was left out, in words ("" for nothing)."""
    if target.provider.pk == agent.provider_id and target.model == agent.model:
        return request, ""
    messages, left_out = request.messages, 0
    if target.provider.pk != agent.provider_id:
        messages = []
        for message in request.messages:
            blocks = [b for b in message.blocks if b.get("type") != "thinking"]
            left_out += len(message.blocks) - len(blocks)
            if blocks:
                messages.append(replace(message, blocks=blocks))
    note = (
        f"; left out: {left_out} thinking block(s) bound to the primary's provider"
        if left_out
        else ""
    )
    return replace(request, model=target.model, messages=messages), note
