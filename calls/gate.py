"""What a provider call passes before it is sent: its project's limits, then the provider's
quota for its (provider, model), where a pool member with room may take it instead
(architecture.md §6.13 to §6.15), and the provider policy at call time (``provider_vetted``).
``call_gated`` waits while there is room within the caller's bound and says what happened as a
value (``Gated``); ``ProviderCall.paced`` applies it to the call.

A project's limits come first: a call they refuse takes nothing of the provider's quota,
which other projects share. A provider that sends no quota headers, and a project without
limits, each cost a dictionary lookup here.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import cache, partial
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings

from agentops.models import Provider
from agentops.outbound import proxy_configured
from agentops.providers import base_url_vet, key_env_problem, key_missing
from agentops.text import bound_text
from agentops.urlsafety import HostUnresolved, IPAddress
from calls.adapters import WireRequest
from calls.classify import paced_error, project_limit_error, redacted
from calls.client import CallResult, Timeline, now_ms
from calls.engine import CallRuntime
from calls.limits import Quota
from calls.project_limits import (
    SLOT_POLL_MS,
    SLOT_RENEW_S,
    Refusal,
    Taken,
    refusal_words,
)
from calls.types import CompiledRequest, ProviderError
from inference.models import InferenceCall

logger = logging.getLogger(__name__)

# Up to this much is added to each wait: callers released by one reset do not all ask at one
# instant.
PACE_JITTER_MS = 50.0


@dataclass(frozen=True)
class Gated:
    """What the gate decided: ``refused``, the result of a call never sent (``deferred``,
    naming the limit or the quota); else it goes, to ``moved`` (a pool member with room
    before its own target: (provider, model)) when set. ``taken``: what it took from its
    project's limits (its slot already given back when refused). ``waited_ms``: how long it
    waited for room."""

    refused: CallResult | None = None
    moved: tuple[Provider, str] | None = None
    taken: Taken | None = None
    waited_ms: float = 0.0


async def call_gated(
    engine: CallRuntime,
    *,
    project_id: int,
    provider: Provider,
    model: str,
    spares: Sequence[tuple[Provider, str]],
    tokens: Callable[[], int],
    max_wait_ms: float | None,
) -> Gated:
    """Wait until the call's project limits and its provider's quota have room for it (its
    ``tokens``: ``token_estimate``, counted only when a limit or a quota needs it); past
    ``max_wait_ms`` (None: a turn's call, which waits at most ``AGENTOPS_FALLBACK_AFTER_MS``
    for its project, then its turn is held), refused. A project slot it took is given back
    when it is refused or cancelled here; its tokens when its row is recorded."""
    tokens = cache(tokens)
    admitted = await _project_admitted(engine, project_id, tokens=tokens, max_wait_ms=max_wait_ms)
    if admitted.refused is not None:
        return admitted
    try:
        paced = await _quota_paced(
            engine, provider, model, spares=spares, tokens=tokens, max_wait_ms=max_wait_ms
        )
    except BaseException:
        await slot_given_back(engine, admitted.taken)
        raise
    if paced.refused is not None:  # its tokens are given back when its row is recorded
        await slot_given_back(engine, admitted.taken)
    return Gated(
        refused=paced.refused,
        moved=paced.moved,
        taken=admitted.taken,
        waited_ms=admitted.waited_ms + paced.waited_ms,
    )


async def _project_admitted(
    engine: CallRuntime, project_id: int, *, tokens: Callable[[], int], max_wait_ms: float | None
) -> Gated:
    """Take the call from its project's limits (§6.14), waiting while one has room within
    ``max_wait_ms``; else refused, naming the limit."""
    limiter = engine.limiter
    if limiter.unlimited(project_id):
        return Gated()
    most = max_wait_ms if max_wait_ms is not None else settings.AGENTOPS_FALLBACK_AFTER_MS
    waited = 0.0
    while True:
        taken = await engine.db(
            partial(limiter.take, project_id=project_id, tokens=tokens(), now_ms=now_ms())
        )
        if not isinstance(taken, Refusal):
            return Gated(taken=taken, waited_ms=waited)
        wait = SLOT_POLL_MS if taken.limit == "concurrent_calls" else taken.wait_ms
        if waited + wait > most:
            return Gated(
                refused=_never_sent(
                    project_limit_error(
                        limit=taken.limit, message=refusal_words(taken), wait_ms=taken.wait_ms
                    )
                )
            )
        wait += random.uniform(0, PACE_JITTER_MS)
        await asyncio.sleep(wait / 1000)
        waited += wait


async def _quota_paced(
    engine: CallRuntime,
    provider: Provider,
    model: str,
    *,
    spares: Sequence[tuple[Provider, str]],
    tokens: Callable[[], int],
    max_wait_ms: float | None,
) -> Gated:
    """Take a request (and ``tokens``) from what the provider said is left for (provider,
    model) (§6.13), or from a spare pool member's when its own has none (§6.15), waiting for
    the first to come back within ``max_wait_ms``; else refused (``paced``)."""
    pacer = engine.pacer
    if pacer.plain(provider.name, model):
        return Gated()
    waited = 0.0
    while True:
        wait = await engine.db(
            partial(pacer.acquire, provider=provider.name, model=model, tokens=tokens()),
            now_ms=now_ms(),
        )
        for spare, spare_model in spares if wait > 0 else ():
            # A pool member with room now takes the call rather than wait (§6.15).
            spare_wait = await engine.db(
                partial(pacer.acquire, provider=spare.name, model=spare_model, tokens=tokens()),
                now_ms=now_ms(),
            )
            if spare_wait <= 0:
                return Gated(moved=(spare, spare_model), waited_ms=waited)
            wait = min(wait, spare_wait)
        if wait <= 0:
            return Gated(waited_ms=waited)
        if max_wait_ms is not None and waited + wait > max_wait_ms:
            # Never sent: its row says ``deferred``, as a call a wait refused.
            return Gated(
                refused=_never_sent(paced_error(provider=provider.name, model=model, wait_ms=wait))
            )
        wait += random.uniform(0, PACE_JITTER_MS)
        await asyncio.sleep(wait / 1000)
        waited += wait


def _never_sent(error: ProviderError) -> CallResult:
    at = now_ms()
    return CallResult(
        outcome=InferenceCall.Outcome.DEFERRED, timeline=Timeline(sent=at, ended=at), error=error
    )


def token_estimate(request: CompiledRequest, body: dict[str, Any] | None) -> int:
    """A call's tokens as a provider's tokens-per-minute count them: its input at about four
    characters a token (``body``: a drop-in's own messages), and its answer's ``max_tokens``."""
    chars = sum(len(str(block)) for m in request.messages for block in m.blocks)
    if body is not None:
        chars += sum(len(str(v)) for v in body.get("messages") or ())
    return chars // 4 + len(request.system) // 4 + (request.max_tokens or 0)


@asynccontextmanager
async def slot_kept(engine: CallRuntime, taken: Taken | None) -> AsyncIterator[None]:
    """While the call runs: its project slot (when it took one) renewed, so only a dead
    process's lapses; given back when it ends."""
    if taken is None or taken.slot is None:
        yield
        return
    renewing = asyncio.ensure_future(_slot_renewed(engine, taken))
    try:
        yield
    finally:
        renewing.cancel()
        await slot_given_back(engine, taken)


async def _slot_renewed(engine: CallRuntime, taken: Taken) -> None:
    while True:
        await asyncio.sleep(SLOT_RENEW_S)
        await engine.db(engine.limiter.renew, taken)


async def slot_given_back(engine: CallRuntime, taken: Taken | None) -> None:
    if taken is not None and taken.slot is not None:
        await engine.db(engine.limiter.release, taken)


def quota_told(engine: CallRuntime, provider: str, model: str, quota: Quota | None) -> None:
    """On the loop, as an answer's head arrives: what its headers say is left, told to every
    process (in a database thread: Redis is a round trip), so the calls waiting to learn it go
    at once rather than when this one ends."""
    pacer = engine.pacer
    if quota is None and pacer.plain(provider, model):
        return  # known to send none: nothing to tell, no round trip
    note = partial(pacer.note, provider=provider, model=model, quota=quota, now_ms=now_ms())
    task = asyncio.ensure_future(engine.db(note))
    engine.keep_until_done(task)


def provider_vetted(provider: Provider, wire: WireRequest) -> tuple[WireRequest, CallResult | None]:
    """The provider policy at call time (every call path asks it before sending): ``wire``
    pinned to the address the check resolved, and None; or, when the policy refuses the call,
    the result of a call that was never sent (an error, not retryable). Blocks on DNS: call
    it off any event loop."""
    checked = _provider_check(provider)
    if isinstance(checked, ProviderError):
        at = now_ms()
        return wire, CallResult(
            outcome="error", timeline=Timeline(sent=at, ended=at), error=checked
        )
    return (replace(wire, addresses=checked) if checked else wire), None


def _provider_check(provider: Provider) -> ProviderError | tuple[IPAddress, ...] | None:
    """The provider policy at call time: the addresses to connect to, or the error that ends
    the call without sending it (None: nothing to pin, e.g. the host is an address)."""
    host = urlsplit(provider.base_url).hostname
    try:
        vetted = base_url_vet(provider.base_url, unresolved_refused=False)
    except HostUnresolved as exc:
        if proxy_configured(provider.base_url):
            return None  # behind a proxy the name may resolve only there: the proxy connects
        logger.warning("provider %s: %s", provider.name, exc)
        return ProviderError(
            type="network", message=bound_text(redacted(str(exc), host)), retryable=True
        )
    problem = f"base_url: {vetted.refusal}" if vetted.refusal else None
    key_problem = key_env_problem(provider.api_key_env) or key_missing(provider.api_key_env)
    if problem is None and key_problem:
        problem = f"api_key_env: {key_problem}"
    if problem is not None:
        logger.warning("provider %s is refused by the provider policy: %s", provider.name, problem)
        return ProviderError(
            type="auth",
            provider_code="provider_refused",
            retryable=False,
            message=bound_text(
                redacted(
                    f"provider {provider.name!r} is refused by the service's provider policy, "
                    f"so no call was made: {problem}",
                    host,
                )
            ),
        )
    return vetted.addresses or None
