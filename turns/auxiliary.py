"""Auxiliary completions (API.md ``POST /agents/{name}/complete``, architecture.md §6.6).

An auxiliary call to a held model is refused without a call: a retryable ``rate_limit``
carrying the remaining wait and ``provider_admission: "deferred"``, so a pacing caller does not
count it as a failed call. A wait the provider states here is recorded and holds the agent's
primary turns too.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings

from agentops.exceptions import BadRequest, CallTimedOut, ProviderFailed, RateLimited
from agentops.models import Agent, Provider
from calls.client import CallResult
from calls.engine import CallRuntime
from calls.records import ms_to_dt
from calls.run import ProviderCall
from calls.types import CompiledRequest, Message, ProviderError
from inference.models import InferenceCall
from turns.episodes import serving_noted, serving_settled
from turns.holds import held_by
from turns.serving import serving_choose, serving_switch
from turns.targets import Serving, primary_serving, routed
from waits.admission import admission_check, remaining_ms
from waits.limits import limit_record


@dataclass(frozen=True)
class AuxMessage:
    participant: str
    content: str


@dataclass(frozen=True)
class Deferred:
    """An auxiliary call's model is held: no call was made."""

    message: str
    retry_after_ms: int | None
    until: datetime | None

    def data(self) -> dict[str, Any]:
        """The 429's fields, the API's and the drop-in endpoints' alike (the instant rendered
        as every instant of the response is)."""
        return {
            "retryable": True,
            "provider_admission": "deferred",
            "retry_after_ms": self.retry_after_ms,
            "until": self.until,
        }


def auxiliary_admit(
    rt: CallRuntime, *, agent: Agent, model: str, max_tokens: int | None
) -> Deferred | None:
    """None when an auxiliary call may go out; else the hold, its ``deferred`` row written.
    Reads the database: call it in a thread."""
    now_ms = time.time() * 1000
    hold = admission_check(agent=agent, model=model, now_ms=now_ms)
    if hold is None:
        return None
    ProviderCall.deferred(
        rt.prices,
        agent=agent,
        kind=InferenceCall.Kind.AUXILIARY,
        model=model,
        max_tokens=max_tokens,
    )
    return Deferred(
        message=(f"{agent.name} / {hold.model} is held: {held_by(hold)}; no call was made"),
        retry_after_ms=remaining_ms(hold, now_ms),
        until=ms_to_dt(hold.until_ms),
    )


def _admit(rt: CallRuntime, agent: Agent, model: str, max_tokens: int | None) -> None:
    """Raises RateLimited (deferred, with its ``deferred`` row written) when the model is held."""
    deferred = auxiliary_admit(rt, agent=agent, model=model, max_tokens=max_tokens)
    if deferred is not None:
        raise RateLimited(deferred.message, data=deferred.data())


def _request(
    agent: Agent, messages: list[AuxMessage], model: str, max_tokens: int | None
) -> CompiledRequest:
    return CompiledRequest(
        model=model,
        system=agent.system,
        max_tokens=max_tokens or agent.max_tokens,
        stream=False,
        messages=[
            Message(role="user", blocks=[{"type": "text", "text": f"{m.participant}: {m.content}"}])
            for m in messages
        ],
    )


async def auxiliary_complete_on_loop(
    rt: CallRuntime,
    *,
    agent: Agent,
    messages: list[AuxMessage],
    model: str | None,
    max_tokens: int | None,
) -> dict[str, Any]:
    """Make one non-streamed auxiliary call, for an async view: the call runs on the request's
    own event loop, and no database connection is held while it does. Returns ``{content,
    stop_reason, call}`` (``call`` the recorded row); raises RateLimited (deferred or
    refused), CallTimedOut, ProviderFailed. The row is written once, with the
    outcome (so an auxiliary call made here is not among the dashboard's calls in flight; it
    shows as it ends)."""
    db = rt.db
    if model is not None or not routed(agent):
        model = model or agent.model
        await db(_admit, rt, agent, model, max_tokens)
        call = ProviderCall(
            rt, agent, _request(agent, messages, model, max_tokens), InferenceCall.Kind.AUXILIARY
        )
        await _run(call)
        # One hop: the row, its end announced (under the request's server span: the thread
        # runs in the request's context) and what the result means.
        return await db(_ended, call)
    # With alternates (architecture.md §6.11): the target the agent's turns would get, and
    # after a failure that routes around, the next one, at once, within this request.
    serving = await db(_served, rt, agent, max_tokens)
    tried: set[tuple[int, str]] = set()
    while True:
        target = serving.target
        tried.add((target.provider.pk, target.model))
        call = ProviderCall(
            rt,
            agent,
            _request(agent, messages, target.model, max_tokens),
            InferenceCall.Kind.AUXILIARY,
            provider=target.provider,
            route=serving.choice.reason,
            route_kind=serving.choice.kind,
            spares=[(t.provider, t.model) for t in serving.spares],
            first_content_bound=serving.first_content_bound,
        )
        await _run(call)
        following = await db(_next, call, tried, serving)
        if not isinstance(following, Serving):
            return following
        serving = following


async def _run(call: ProviderCall) -> None:
    """The call, not sent as in flight; when the client goes away (Django cancels the view)
    it ends and its row is written ``aborted``, as a drop-in's is: every provider request has
    its row."""
    running = asyncio.ensure_future(
        call.run(in_flight=False, pace_max_ms=settings.AGENTOPS_DROPIN_MAX_WAIT_MS)
    )
    try:
        await asyncio.shield(running)
    except asyncio.CancelledError:
        call.abort()
        await _recorded_anyway(running, call)
        raise


async def _recorded_anyway(running: asyncio.Future[Any], call: ProviderCall) -> None:
    try:
        # Once sent, the abort ends it at once; aborted before it was sent, it runs to its end.
        await running
    except Exception:
        return  # it failed before its end (no result): the caller's error path, as before
    if call.result is not None:
        await call.engine.db(call.end)


def _served(rt: CallRuntime, agent: Agent, max_tokens: int | None) -> Serving:
    """The target for an auxiliary call with alternates; raises RateLimited (deferred) when
    the call waits out the primary's hold."""
    serving = serving_choose(rt.pacer, agent, time.time() * 1000)
    if serving is None:
        _admit(rt, agent, agent.model, max_tokens)
        return primary_serving(agent)
    serving_noted(agent, serving)
    return serving


def _next(
    call: ProviderCall, tried: set[tuple[int, str]], serving: Serving
) -> Serving | dict[str, Any]:
    """After a call with alternates, in one hop: its row written, its stated wait recorded
    (once); the next target when the failure routes around and one not yet tried may serve,
    else what the call means (``_outcome``)."""
    row = call.end()
    result, agent = call.result, call.agent
    assert result is not None
    serving_settled(agent, row)
    error = result.error
    binding = None
    if error is not None and error.retry_after_ms is not None and error.type != "paced":
        binding = _wait_recorded(agent, row.model, error, call.provider)
    if result.outcome != "completed" and error is not None:
        target = serving.target
        switched = serving_switch(
            call.engine.pacer,
            agent,
            time.time() * 1000,
            error=error,
            tried=tried,
            failed=(target.provider.pk, target.model),
        )
        if switched is not None:
            serving_noted(agent, switched)
            return switched
    return _outcome(agent, row.model, row, result, binding=binding)


def _ended(call: ProviderCall) -> dict[str, Any]:
    row = call.end()
    assert call.result is not None
    return _outcome(call.agent, call.request.model, row, call.result, call.provider)


def _wait_recorded(
    agent: Agent, model: str, error: ProviderError, provider: Provider | None = None
) -> bool:
    """The refusal's wait recorded at its scope (§6.12), for ``model`` on ``provider``."""
    return limit_record(
        agent=agent,
        provider=provider or agent.provider,
        model=model,
        error=error,
        now_ms=time.time() * 1000,
        own_provider=provider is None or provider.pk == agent.provider_id,
    ).binding


def _outcome(
    agent: Agent,
    model: str,
    call: InferenceCall,
    result: CallResult,
    provider: Provider | None = None,
    *,
    binding: bool | None = None,
) -> dict[str, Any]:
    """The completion, or the error it raises (a stated wait recorded first, unless
    ``binding`` says it was already: whether it binds)."""
    if result.outcome == "completed" and result.output is not None:
        return {
            "content": result.output.text,
            "stop_reason": result.output.stop_reason,
            "call": call,
        }
    error = result.error
    assert error is not None
    if error.type in ("budget_busy", "paced"):
        # Not held: it fits once the calls in flight settle, or once the provider's quota
        # comes back (§6.13); pacing is no wait to record.
        raise RateLimited(
            error.message,
            data={
                "retryable": True,
                "retry_after_ms": error.retry_after_ms
                if error.type == "paced"
                else settings.AGENTOPS_BUDGET_BUSY_RETRY_MS,
                "recorded": False,
                "call": call.pk,
                **({"limit": error.limit} if error.limit is not None else {}),
            },
        )
    if error.type == "budget_refused":  # never fits as it is: the request must change
        raise BadRequest(error.message, data={"field": error.provider_code, "call": call.pk})
    if result.outcome == "cut":
        raise CallTimedOut(error.message, data={"bound": error.bound, "call": call.pk})
    if error.retry_after_ms is not None:
        recorded = binding if binding is not None else _wait_recorded(agent, model, error, provider)
        wait = error.retry_after_ms if math.isfinite(error.retry_after_ms) else None
        raise RateLimited(
            error.message,
            data={
                "retryable": error.retryable,
                "provider_admission": "refused",
                "retry_after_ms": wait,
                "recorded": recorded,
                "call": call.pk,
            },
        )
    raise ProviderFailed(error.message, data={**error.as_dict(), "call": call.pk})
