"""Where each attempt of a drop-in request goes and whether it is made again (architecture.md
§6.11, §14.1): the same routing as the agent's turns among targets of the request's own wire
format (``dropin_target``, ``dropin_hedge``), and the rule for calling again after an attempt
failed before its response started (``again_after_ms``).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Collection
from dataclasses import dataclass, replace

from django.conf import settings

from agentops.models import Agent, Provider
from calls.client import CallResult
from calls.pacing import Pacer
from calls.run import ProviderCall
from calls.types import ProviderError
from turns.episodes import serving_noted
from turns.routing import PRIMARY, Choice
from turns.serving import serving_choose, serving_hedge, serving_switch
from turns.targets import Serving, routed

# The jitters before calling again after a 5xx or a network failure, all of a request's
# together, are at most this long: a caller waits seconds, not a backoff's minutes.
JITTER_TOTAL_MS = 2000.0


@dataclass(frozen=True)
class Attempt:
    """Where one attempt of a drop-in request goes: a provider, the model named to it, and
    why (the routing ``choice``, on its call row); ``first_content_bound``: a return attempt's
    (§6.11)."""

    provider: Provider
    model: str
    choice: Choice = PRIMARY
    # Pool members that may take the call if this one's quota has no room (§6.15).
    spares: tuple[tuple[Provider, str], ...] = ()
    first_content_bound: tuple[float, str] | None = None


def dropin_target(
    pacer: Pacer,
    agent: Agent,
    tried: Collection[tuple[int, str]],
    *,
    failed: tuple[int, str] | None = None,
    error: ProviderError | None = None,
    retry_first: bool = False,
) -> Attempt | None:
    """In a thread: the target the agent's turns would get among its alternates of the
    request's own wire format (architecture.md §6.11), or None: the first attempt goes to the
    agent's own (its admission check may defer it), and after the attempt to ``failed`` ((provider
    id, model), as called) ended with ``error`` no other target than those ``tried`` may serve
    (the same one may be called again, ``again_after_ms``)."""
    if not routed(agent):
        return None
    now_ms, kind = time.time() * 1000, agent.provider.kind
    if failed is not None and error is not None:
        serving = serving_switch(
            pacer,
            agent,
            now_ms,
            error=error,
            tried=tried,
            failed=failed,
            kind=kind,
            retry_first=retry_first,
        )
    else:
        serving = serving_choose(pacer, agent, now_ms, kind=kind)
    if serving is None:
        return None
    serving_noted(agent, serving)
    return _target(serving)


def dropin_hedge(pacer: Pacer, agent: Agent, tried: Collection[tuple[int, str]]) -> Attempt | None:
    """In a thread: where a request is also sent when its attempt has produced no content after
    the agent's ``hedge_after_ms`` (§6.11), or None."""
    serving = serving_hedge(
        pacer,
        agent,
        time.time() * 1000,
        tried=tried,
        kind=agent.provider.kind,
    )
    return None if serving is None else _target(serving)


def attempt_key(target: Attempt) -> tuple[int, str]:
    """The attempt as routing knows a target: (provider id, model)."""
    return target.provider.pk, target.model


def as_called(target: Attempt, call: ProviderCall) -> Attempt:
    """The target as its call went out: a pool spare may have taken the call before it was
    sent (§6.15), and then its failure, its stated wait and what is tried are that spare's."""
    if (call.provider.pk, call.request.model) == attempt_key(target):
        return target
    return replace(target, provider=call.provider, model=call.request.model, spares=())


def _target(serving: Serving) -> Attempt:
    return Attempt(
        serving.target.provider,
        serving.target.model,
        serving.choice,
        tuple((t.provider, t.model) for t in serving.spares),
        serving.first_content_bound,
    )


def again_after_ms(
    *,
    result: CallResult | None,
    started: bool,
    retries_left: int,
    jitter_ms: float,
    fallback_after_ms: float,
) -> float | None:
    """How long to wait before a drop-in request calls again after an attempt ended with
    ``result``, or None: it does not (the result is the answer). ``started``: the provider's
    response had started (an event or a body), so the caller may have read some of it.

    Again only with retries left, before the response started, for: a stated wait of at most
    ``fallback_after_ms`` (after that wait; a longer one is the caller's to honour), or, without
    a stated wait, an HTTP 5xx or a network failure (a reset, a refused or failed connect), after
    ``jitter_ms``. Never for a cut (a silent provider is not called twice in a row), a refusal,
    or a rate limit that states no wait."""
    if result is None or result.error is None or started or retries_left <= 0:
        return None
    error: ProviderError = result.error
    if result.outcome == "cut" or not error.retryable or error.type == "paced":
        return None  # a paced call already waited what a drop-in waits (§6.13)
    if error.type == "budget_busy":  # it fits once the budget's calls in flight settle
        return settings.AGENTOPS_BUDGET_BUSY_RETRY_MS
    wait = error.retry_after_ms
    if wait is not None:
        if not math.isfinite(wait) or wait > fallback_after_ms:
            return None
        return max(0.0, wait)
    if error.type == "network" or (error.http_status or 0) >= 500:
        return jitter_ms
    return None


def jitter_ms(retries: int) -> float:
    """One retry's jitter: a random share of JITTER_TOTAL_MS split over ``retries``, and at
    most half the interval at which a down target is tried again: a retried 5xx and its first
    failure then fall within that interval of each other (unless the retry itself takes longer
    than the other half to fail) and make the target down (§6.11), so the next request does not
    call it a third time at once."""
    share = random.uniform(0.25, 1.0) * JITTER_TOTAL_MS / max(1, retries)
    return min(share, settings.AGENTOPS_FALLBACK_RETRY_PRIMARY_MS / 2)
