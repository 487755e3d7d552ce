"""What ``GET /agents/{name}`` and the dashboard show of an agent's routing (architecture.md
§6.11, §6.15): the alternate that would serve its next call (``serving_out``) and its pool's
members as routing sees them (``pool_out``). Reads only: looking moves no pool's rotation.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, Q

from agentops.models import Agent
from calls.pacing import Pacer
from inference.models import InferenceCall
from inference.routes import RouteKind
from turns.routing import alternates, down_until
from turns.serving import as_failure, latest_calls, serving_choose
from turns.targets import agent_candidates
from waits.admission import admission_checks

FAILED = (InferenceCall.Outcome.ERROR, InferenceCall.Outcome.CUT)


def pool_out(pacer: Pacer, agent: Agent, now_ms: float) -> list[dict[str, Any]]:
    """``GET /agents/{name}``'s ``pool``: each member (the agent's own first) as routing sees
    it now, with its calls and errors in the last hour (§6.15)."""
    candidates, pooled = agent_candidates(agent)
    members = candidates[:pooled]
    keys = [
        (c.model, "" if c.provider_id == agent.provider_id else c.provider_name) for c in members
    ]
    holds = admission_checks(agent=agent, targets=keys, now_ms=now_ms)
    latest = latest_calls(agent, members)
    quotas = pacer.standing([(c.provider_name, c.model) for c in members], now_ms=now_ms)
    since = datetime.fromtimestamp(now_ms / 1000 - 3600, UTC)
    counts = {
        (row["provider_id"], row["model"]): row
        for row in InferenceCall.objects.filter(agent=agent, sent_at__gte=since)
        .values("provider_id", "model")
        .annotate(calls=Count("id"), errors=Count("id", filter=Q(outcome__in=FAILED)))
    }
    out = []
    for member, hold, quota in zip(members, holds, quotas, strict=True):
        rows = latest.get((member.provider_id, member.model), [])
        down, _ = down_until(
            [as_failure(row) for row in rows],
            retry_after_ms=settings.AGENTOPS_FALLBACK_RETRY_PRIMARY_MS,
        )
        counted = counts.get((member.provider_id, member.model), {})
        out.append(
            {
                "provider": member.provider_name,
                "model": member.model,
                "weight": member.weight,
                "calls_last_hour": counted.get("calls", 0),
                "errors_last_hour": counted.get("errors", 0),
                "remaining": None if quota[1] is None else round(quota[1], 3),
                "paced_until": _instant(now_ms + quota[0]) if quota[0] > 0 else None,
                "held": hold is not None,
                "held_until": _instant(hold.until_ms) if hold and hold.until_ms else None,
                "down_until": _instant(down) if down and down > now_ms else None,
            }
        )
    return out


def _instant(ms: float | None) -> datetime | None:
    return None if ms is None or not math.isfinite(ms) else datetime.fromtimestamp(ms / 1000, UTC)


def serving_out(pacer: Pacer, agent: Agent, now_ms: float) -> dict[str, Any] | None:
    """``GET /agents/{name}``'s ``serving``: the alternate that would serve the agent's next turn
    call, or None when the primary would. ``since``: that alternate's first call of the episode
    (None while it has served none: a drop-in may be served by another, of its wire format)."""
    if not alternates(agent.fallbacks):
        return None
    serving = serving_choose(pacer, agent, now_ms, peek=True)
    if serving is None or not serving.on_alternate:
        return None
    # The episode began with the first call to an alternate after the primary's latest.
    calls = InferenceCall.objects.filter(agent=agent)
    last_primary = (
        calls.exclude(route_kind=RouteKind.FALLBACK).order_by("-id").values_list("id", flat=True)
    ).first()
    target = serving.target
    since = (
        calls.filter(
            route_kind=RouteKind.FALLBACK,
            id__gt=last_primary or 0,
            provider=target.provider,
            model=target.model,
        )
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
