"""Which provider and model serve an agent's next call (architecture.md §6.11, §6.15): what the
journal, the call rows and the pacing say of each of its targets (``turns.targets``), the one
choice (``turns.routing``), and the switch or hedge to another target within a request.

Nothing is kept in memory but a pool's rotation: a restarted process derives the same choice
from the same rows. An agent without alternates costs nothing here (no query).
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from django.conf import settings
from django.db import connection

from agentops.models import Agent, Provider
from calls.pacing import Pacer
from calls.types import ProviderError
from inference.models import InferenceCall
from inference.routes import RouteKind
from turns.routing import (
    DOWN_TWICE,
    SWITCH_ON,
    Choice,
    Failure,
    Seen,
    alternates,
    down_until,
    overflow_need,
    route_choose,
    smooth_pick,
)
from turns.targets import (
    Candidate,
    Serving,
    Target,
    agent_candidates,
    primary_serving,
    target_window,
)
from waits.admission import admission_checks

ENDED = (InferenceCall.Outcome.COMPLETED, InferenceCall.Outcome.ERROR, InferenceCall.Outcome.CUT)


def serving_choose(
    pacer: Pacer,
    agent: Agent,
    now_ms: float,
    *,
    kind: str | None = None,
    need_tokens: int = 0,
    avoid: Collection[tuple[int, str]] = (),
    peek: bool = False,
) -> Serving | None:
    """The target for the agent's next call (among those of wire format ``kind``, if given;
    with ``need_tokens``, among those whose known window is at least that: §5.9; never one in
    ``avoid``, as (provider id, model)), or None when the call waits out the primary's hold
    (the caller holds the turn as before alternates existed). With a pool (§6.15) a usable
    member is chosen by weight and what it has left; the alternates come only when none is.
    ``peek``: only to look (the API's view, a window test): the pool's rotation stays where it
    is, so only calls that go out move it on.
    Three reads whatever the number of targets: the journal (its cached view), each target's
    two latest ended calls in one statement, and their quotas in one round trip to Redis."""
    candidates, pooled = agent_candidates(agent, kind=kind)
    if len(candidates) == 1:
        return primary_serving(agent)
    keys = [
        (c.model, "" if c.provider_id == agent.provider_id else c.provider_name) for c in candidates
    ]
    holds = admission_checks(agent=agent, targets=keys, now_ms=now_ms)
    latest = latest_calls(agent, candidates)
    quotas = pacer.standing([(c.provider_name, c.model) for c in candidates], now_ms=now_ms)
    seen: list[Seen] = []
    latest_id, previous = 0, None
    for index, (candidate, hold) in enumerate(zip(candidates, holds, strict=True)):
        rows = latest.get((candidate.provider_id, candidate.model), [])
        if rows and rows[0]["id"] > latest_id:
            latest_id, previous = rows[0]["id"], index
        until, why = down_until(
            [as_failure(row) for row in rows],
            retry_after_ms=settings.AGENTOPS_FALLBACK_RETRY_PRIMARY_MS,
        )
        held, hold_until = hold is not None, hold.until_ms if hold else None
        paced = quotas[index][0]
        if not held and paced > settings.AGENTOPS_FALLBACK_AFTER_MS:
            # Its quota is spent for longer than a wait worth waiting out (§6.13): as held.
            held, hold_until = True, math.ceil(now_ms + paced)
        if agent.kind == Agent.Kind.EPHEMERAL and rows:
            # An ephemeral agent records no wait (§6.9): its target's latest stated wait is
            # read from the row, so a long one is routed around all the same.
            held, hold_until = _stated_hold(rows[0], now_ms)
        if (candidate.provider_id, candidate.model) in avoid:
            until, why = math.inf, "tried in this request"
        window = agent.known_window if index == 0 else candidate.context_window
        if need_tokens and (window is None or window < need_tokens):
            # Too small a window (or none known) is no target for this request.
            until, why = math.inf, f"the request, about {need_tokens} tokens, is over its window"
        seen.append(Seen(held=held, hold_until=hold_until, down_until=until, down_why=why))
    member, first, others = 0, seen[0], []
    if pooled > 1:
        usable = [
            i
            for i in range(pooled)
            if not seen[i].held and not _is_down(seen[i], now_ms) and quotas[i][0] <= 0
        ]
        waiting = [i for i in range(pooled) if not seen[i].held and not _is_down(seen[i], now_ms)]
        if usable:
            member, first = (
                _member_pick(pacer, agent, candidates, quotas, usable, peek=peek),
                Seen(),
            )
        elif waiting:  # every usable member is paced: the one whose quota comes back first
            member, first = min(waiting, key=lambda i: quotas[i][0]), Seen()
        elif not first.held:
            first = Seen(down_until=math.inf, down_why="every pool member is held, paced or down")
        others = sorted((i for i in waiting if i != member), key=lambda i: quotas[i][0])
    route = [first, *seen[pooled:]]
    choice = route_choose(
        route, now_ms=now_ms, fallback_after_ms=settings.AGENTOPS_FALLBACK_AFTER_MS
    )
    if choice is None:
        return None
    if previous is not None:  # as routing counts targets: the pool is the primary
        previous = 0 if previous < pooled else previous - pooled + 1
    if choice.index == 0 and pooled > 1 and choice.fresh:
        choice = Choice(0, RouteKind.POOL)
    elif choice.index == 0 and previous not in (None, 0):
        choice = Choice(0, RouteKind.RETURNING, fresh=choice.fresh)
    at = member if choice.index == 0 else pooled + choice.index - 1
    chosen = candidates[at]
    provider = agent.provider if at == 0 else Provider.objects.filter(pk=chosen.provider_id).first()
    if provider is None:  # deleted since it was listed
        return primary_serving(agent)
    spares: tuple[Target, ...] = ()
    if choice.index == 0 and choice.fresh and others:
        found = {
            p.pk: p
            for p in Provider.objects.filter(pk__in=[candidates[i].provider_id for i in others])
        }
        spares = tuple(
            Target(found[c.provider_id], c.model, c.context_window)
            for c in (candidates[i] for i in others)
            if c.provider_id in found
        )
    return Serving(
        Target(provider, chosen.model, chosen.context_window),
        choice,
        previous=previous,
        primary_until=seen[0].hold_until,
        primary_held=seen[0].held,
        member=member if choice.index == 0 else 0,
        spares=spares,
        returning=choice.index == 0 and choice.fresh and previous not in (None, 0),
    )


def _is_down(seen: Seen, now_ms: float) -> bool:
    return seen.down_until is not None and seen.down_until > now_ms


def _member_pick(
    pacer: Pacer,
    agent: Agent,
    candidates: list[Candidate],
    quotas: list[tuple[float, float | None]],
    usable: list[int],
    *,
    peek: bool = False,
) -> int:
    """A usable pool member, in a smooth rotation by its weight times the share of its quota
    its provider last said is left (a member that has said nothing counts as full)."""
    scores = [candidates[i].weight * max(0.05, quotas[i][1] or 1.0) for i in usable]
    keys = [(candidates[i].provider_id, candidates[i].model) for i in usable]
    picked: list[int] = []

    def turned(kept: dict[tuple[int, str], float] | None) -> dict[tuple[int, str], float]:
        kept = kept or {}
        pick, credit = smooth_pick(scores, [kept.get(key, 0.0) for key in keys])
        picked.append(pick)
        return {**kept, **dict(zip(keys, credit, strict=True))}

    if peek:
        turned(pacer.rotations.get(agent.pk))
    else:
        pacer.rotations.change(agent.pk, turned)
    return usable[picked[0]]


def serving_switch(
    pacer: Pacer,
    agent: Agent,
    now_ms: float,
    *,
    error: ProviderError,
    tried: Collection[tuple[int, str]],
    failed: tuple[int, str],
    kind: str | None = None,
    retry_first: bool = False,
) -> Serving | None:
    """After a failed call to ``failed`` (as (provider id, model)): the target the same request
    goes to at once, or None. A failure that routes around (``SWITCH_ON``) goes to the one
    choice (``serving_choose``: holds at every scope, pacing, the down state) when it may serve
    and is not a target already ``tried`` (with ``retry_first``, a lone 5xx or network failure
    of a target outside a pool leaves it to be called again first); a refusal for length (§5.9) only to a target whose
    window is larger than the one the refusal stated (the request counts as at least that).
    Turns, ``/complete`` and the drop-ins all switch through it."""
    need = 0
    if error.type == "context_length":
        need = overflow_need(error.context_limit, target_window(agent, failed)) or 0
        if not need:
            return None
    elif error.type not in SWITCH_ON:
        return None
    avoid = set(tried)
    if retry_first and error.type in DOWN_TWICE and not alternates(agent.pool):
        # A lone 5xx may be a blip: a caller that calls the same target again first
        # (``retry_first``: a drop-in's own retry, a turn's policy) passes it over once its
        # failures make it down (§6.11). Within a pool another member takes the call at once.
        avoid.discard(failed)
    serving = serving_choose(pacer, agent, now_ms, kind=kind, avoid=avoid, need_tokens=need)
    if serving is None or not serving.choice.fresh:
        return None
    if (serving.target.provider.pk, serving.target.model) in tried:
        return None
    return serving


def serving_hedge(
    pacer: Pacer,
    agent: Agent,
    now_ms: float,
    *,
    tried: Collection[tuple[int, str]],
    kind: str | None = None,
) -> Serving | None:
    """The target a request is also sent to when its call has produced no content after the
    agent's ``hedge_after_ms`` (§6.11): the first alternate (or pool member) that may serve and
    was not ``tried``; None with hedging off or none free."""
    if agent.hedge_after_ms is None:
        return None
    serving = serving_choose(pacer, agent, now_ms, kind=kind, avoid=tried)
    if serving is None or not serving.choice.fresh:
        return None
    if (serving.target.provider.pk, serving.target.model) in tried:
        return None
    why = f"no content from the first call after {agent.hedge_after_ms} ms"
    choice = Choice(serving.choice.index, RouteKind.HEDGE, why)
    return replace(serving, choice=choice, returning=False)


def latest_calls(
    agent: Agent, candidates: list[Candidate]
) -> dict[tuple[int, str], list[dict[str, Any]]]:
    """Each candidate's two latest ended calls, newest first, in one statement whatever their
    number (an index lookup on ``call_target_latest`` per candidate). Hand-written: the ORM's
    union of sliced queries cost 1.7 ms a choice to build and plan (docs/performance.md)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _LATEST_SQL,
            [
                [c.provider_id for c in candidates],
                [c.model for c in candidates],
                agent.pk,
                list(ENDED),
            ],
        )
        found: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for (
            call_id,
            provider_id,
            model,
            error,
            ended_at,
            first_content_at,
            route_kind,
        ) in cursor.fetchall():
            found.setdefault((provider_id, model), []).append(
                {
                    "id": call_id,
                    "error": json.loads(error) if isinstance(error, str) else error,
                    "ended_at": ended_at,
                    "first_content_at": first_content_at,
                    "route_kind": route_kind,
                }
            )
    return found


_CALLS = InferenceCall._meta.db_table
_LATEST_SQL = f"""
    SELECT c.id, c.provider_id, c.model, c.error, c.ended_at, c.first_content_at, c.route_kind
    FROM unnest(%s::bigint[], %s::text[]) AS t(provider_id, model)
    CROSS JOIN LATERAL (
        SELECT id, provider_id, model, error, ended_at, first_content_at, route_kind FROM {_CALLS}
        WHERE agent_id = %s AND provider_id = t.provider_id AND model = t.model
          AND outcome = ANY(%s)
        ORDER BY id DESC LIMIT 2
    ) c
    ORDER BY c.id DESC"""


def _stated_hold(row: Mapping[str, Any], now_ms: float) -> tuple[bool, int | None]:
    """Whether the wait a call's error stated still runs at ``now_ms``, and until when."""
    error, ended = row["error"], row["ended_at"]
    if not isinstance(error, dict) or ended is None:
        return False, None
    if error.get("until_released"):
        return True, None
    wait = error.get("retry_after_ms")
    if not isinstance(wait, int | float):
        return False, None
    until = math.ceil(ended.timestamp() * 1000 + wait)
    return until > now_ms, until


def as_failure(row: Mapping[str, Any]) -> Failure:
    error = row["error"]
    ended = row["ended_at"]
    return Failure(
        kind=error.get("type") if isinstance(error, dict) else None,
        stated_wait=isinstance(error, dict)
        and (error.get("retry_after_ms") is not None or bool(error.get("until_released"))),
        after_content=row["first_content_at"] is not None,
        ended_ms=ended.timestamp() * 1000 if ended is not None else 0.0,
        returning=row["route_kind"] == RouteKind.RETURNING,
    )
