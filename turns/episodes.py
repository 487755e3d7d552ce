"""A fallback episode told once each way (architecture.md §6.11): ``fallback-engaged`` when a
call goes to an alternate and none is open, ``fallback-ended`` once the primary (or a pool
member) answered while one is. The episode's state is the agent's latest fallback alert.
"""

from __future__ import annotations

from django.conf import settings

from agentops.alerts import alert_raise
from agentops.models import Agent, Alert
from inference.models import InferenceCall
from inference.routes import RouteKind
from turns.routing import alternates
from turns.targets import Serving


def serving_noted(agent: Agent, serving: Serving) -> None:
    """Alert when a call goes to an alternate and no episode is open (``fallback-engaged``). A
    return attempt that fails and goes back to the alternate opens none: the episode it
    belongs to is still open. Its end is ``serving_settled``'s to say."""
    if not serving.on_alternate or _episode_open(agent):
        return
    target = serving.target
    alert_raise(
        kind="fallback-engaged",
        agent=agent.name,
        model=agent.model,
        message=(
            f"Agent {agent.name} is served by {target.model} on {target.provider.name} "
            f"instead of {agent.model} on {agent.provider.name}: "
            f"{serving.choice.why}. Its calls go there until "
            "the primary's wait ends or is released, or, when the primary was down, once "
            f"every {settings.AGENTOPS_FALLBACK_RETRY_PRIMARY_MS / 1000:.0f} s to try it."
        ),
        data={
            "provider": target.provider.name,
            "model": target.model,
            "reason": serving.choice.reason,
        },
    )


def serving_settled(agent: Agent, call: InferenceCall) -> None:
    """Once a call's row is written: ``fallback-ended`` when it is the primary's (or a pool
    member's) and answered while an episode is open. Only what happened: a return attempt
    chosen, or one that failed, ends nothing. Reads nothing for an agent without alternates,
    nor for a call that did not answer."""
    if (
        call.outcome != InferenceCall.Outcome.COMPLETED
        or RouteKind(call.route_kind).alternate
        or not alternates(agent.fallbacks)
        or not _episode_open(agent)
    ):
        return
    alert_raise(
        kind="fallback-ended",
        agent=agent.name,
        model=agent.model,
        message=(
            f"Agent {agent.name} is served by its own {agent.model} on "
            f"{agent.provider.name} again: a call to it answered."
        ),
        data={"provider": agent.provider.name, "model": agent.model, "call": call.pk},
    )


def _episode_open(agent: Agent) -> bool:
    """Whether a fallback episode is open: the agent's latest fallback alert says engaged.
    The alerts are what was reported, so each episode is told once each way; one index
    lookup (``kind``, ``agent``) over a handful of rows."""
    latest = (
        Alert.objects.filter(agent=agent.name, kind__in=("fallback-engaged", "fallback-ended"))
        .order_by("-id")
        .values_list("kind", flat=True)
        .first()
    )
    return latest == "fallback-engaged"
