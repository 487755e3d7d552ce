"""Which provider and model serve an agent's next call (architecture.md §6.11): what the journal
and the call rows say of each target, the choice (``turns.routing``) and its alerts.

Nothing is kept in memory: a restarted process derives the same choice from the same rows.
An agent without alternates costs nothing here (no query).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from django.conf import settings

from agentops.alerts import alert_raise
from agentops.models import Agent, Provider
from calls.types import CompiledRequest
from inference.models import InferenceCall
from turns.routing import Choice, Failure, Seen, alternates, down_until, route_choose
from waits.admission import admission_check

logger = logging.getLogger(__name__)

ENDED = (InferenceCall.Outcome.COMPLETED, InferenceCall.Outcome.ERROR, InferenceCall.Outcome.CUT)


@dataclass(frozen=True)
class Target:
    provider: Provider
    model: str
    context_window: int | None = None


@dataclass(frozen=True)
class Serving:
    """The target chosen for a call and why; ``previous``: the target of the agent's latest
    ended call among its targets (None: none yet); ``primary_until``: the primary's hold."""

    target: Target
    choice: Choice
    previous: int | None = None
    primary_until: int | None = None
    primary_held: bool = False

    @property
    def on_alternate(self) -> bool:
        return self.choice.index > 0


def wait_provider(agent: Agent, provider: Provider) -> str:
    """How the journal names the provider a wait binds on: "" for the agent's own (as in
    every wait recorded before alternates existed), else its name (§6.11)."""
    return "" if provider.pk == agent.provider_id else provider.name


def primary_serving(agent: Agent) -> Serving:
    return Serving(Target(agent.provider, agent.model), Choice(0, "primary"))


def agent_targets(agent: Agent, *, kind: str | None = None) -> list[Target]:
    """The agent's own provider and model, then its alternates whose provider exists (and,
    with ``kind``, speaks that wire format: a drop-in request's body is in its own)."""
    targets = [Target(agent.provider, agent.model)]
    listed = alternates(agent.fallbacks)
    if not listed:
        return targets
    names = {str(f.get("provider")) for f in listed}
    found = {p.name: p for p in Provider.objects.filter(name__in=names)}
    for entry in listed:
        provider = found.get(str(entry.get("provider")))
        if provider is None:  # deleted since: skipped, said once per choice
            logger.warning(
                "agent %s: alternate provider %r no longer exists; skipped",
                agent.name,
                entry.get("provider"),
            )
            continue
        if kind is None or provider.kind == kind:
            targets.append(Target(provider, str(entry["model"]), entry.get("context_window")))
    return targets


def serving_choose(agent: Agent, now_ms: float, *, kind: str | None = None) -> Serving | None:
    """The target for the agent's next call (among those of wire format ``kind``, if given),
    or None when the call waits out the primary's hold (the caller holds the turn as before
    alternates existed). Reads the journal and each target's two latest ended calls."""
    targets = agent_targets(agent, kind=kind)
    if len(targets) == 1:
        return primary_serving(agent)
    seen: list[Seen] = []
    latest_id, previous = 0, None
    for index, target in enumerate(targets):
        hold = admission_check(
            agent=agent,
            model=target.model,
            now_ms=now_ms,
            provider=wait_provider(agent, target.provider),
        )
        rows = list(
            InferenceCall.objects.filter(
                agent=agent, provider=target.provider, model=target.model, outcome__in=ENDED
            )
            .order_by("-id")
            .values("id", "error", "ended_at", "first_content_at")[:2]
        )
        if rows and rows[0]["id"] > latest_id:
            latest_id, previous = rows[0]["id"], index
        until, why = down_until(
            [_failure(row) for row in rows],
            retry_after_ms=settings.AGENTOPS_FALLBACK_RETRY_PRIMARY_MS,
        )
        seen.append(
            Seen(
                held=hold is not None,
                hold_until=hold.until_ms if hold else None,
                down_until=until,
                down_why=why,
            )
        )
    choice = route_choose(
        seen, now_ms=now_ms, fallback_after_ms=settings.AGENTOPS_FALLBACK_AFTER_MS
    )
    if choice is None:
        return None
    if choice.index == 0 and previous not in (None, 0):
        choice = Choice(0, "return to primary", choice.fresh)
    return Serving(
        targets[choice.index],
        choice,
        previous=previous,
        primary_until=seen[0].hold_until,
        primary_held=seen[0].held,
    )


def _failure(row: Mapping[str, Any]) -> Failure:
    error = row["error"]
    ended = row["ended_at"]
    return Failure(
        kind=error.get("type") if isinstance(error, dict) else None,
        stated_wait=isinstance(error, dict)
        and (error.get("retry_after_ms") is not None or bool(error.get("until_released"))),
        after_content=row["first_content_at"] is not None,
        ended_ms=ended.timestamp() * 1000 if ended is not None else 0.0,
    )


def serving_noted(agent: Agent, serving: Serving) -> None:
    """Alert when a call goes to an alternate after the primary served (``fallback-engaged``),
    and when the primary serves again after an alternate (``fallback-ended``): once each per
    episode, since an episode is the run of calls between the two."""
    target = serving.target
    if serving.on_alternate and serving.previous in (None, 0):
        alert_raise(
            kind="fallback-engaged",
            agent=agent.name,
            model=agent.model,
            message=(
                f"Agent {agent.name} is served by {target.model} on {target.provider.name} "
                f"instead of {agent.model} on {agent.provider.name}: "
                f"{serving.choice.reason.removeprefix('fallback: ')}. Its calls go there until "
                "the primary's wait ends or is released, or, when the primary was down, once "
                f"every {settings.AGENTOPS_FALLBACK_RETRY_PRIMARY_MS / 1000:.0f} s to try it."
            ),
            data={
                "provider": target.provider.name,
                "model": target.model,
                "reason": serving.choice.reason,
            },
        )
    elif not serving.on_alternate and serving.previous not in (None, 0):
        alert_raise(
            kind="fallback-ended",
            agent=agent.name,
            model=agent.model,
            message=(
                f"Agent {agent.name} is served by its own {agent.model} on "
                f"{agent.provider.name} again."
            ),
            data={"provider": agent.provider.name, "model": agent.model},
        )


def serving_out(agent: Agent, now_ms: float) -> dict[str, Any] | None:
    """``GET /agents/{name}``'s ``serving``: the alternate that would serve the next call, or
    None when the primary would."""
    if not alternates(agent.fallbacks):
        return None
    serving = serving_choose(agent, now_ms)
    if serving is None or not serving.on_alternate:
        return None
    # The episode began with the first call to an alternate after the primary's latest.
    calls = InferenceCall.objects.filter(agent=agent)
    last_primary = (
        calls.exclude(route__startswith="fallback").order_by("-id").values_list("id", flat=True)
    ).first()
    since = (
        calls.filter(route__startswith="fallback", id__gt=last_primary or 0)
        .order_by("id")
        .values_list("sent_at", flat=True)
        .first()
    )
    return {
        "provider": serving.target.provider.name,
        "model": serving.target.model,
        "since": since,
        "reason": serving.choice.reason,
        "primary_until": serving.primary_until,
        "primary_held": serving.primary_held,
    }


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
