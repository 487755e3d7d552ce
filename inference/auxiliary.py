"""Auxiliary completions (API.md ``POST /agents/{name}/complete``, DESIGN §6.6).

An auxiliary call to a held model is refused without a call: a retryable ``rate_limit``
carrying the remaining wait and ``provider_admission: "deferred"``, so a pacing caller does not
count it as a failed call. A wait the provider states here is recorded and holds the agent's
primary turns too.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

from django.utils import timezone

from agentops.background import background_loop
from agentops.dashboard import dashboard_call_ended, dashboard_call_started
from agentops.exceptions import CallTimedOut, ProviderFailed, RateLimited
from agentops.models import Agent

from .adapters import build_wire
from .client import CallResult, perform_call
from .config import bounds_settings
from .models import InferenceCall, Turn
from .records import call_record, ms_to_dt
from .selectors import call_out
from .types import CompiledRequest, Message


@dataclass(frozen=True)
class AuxMessage:
    participant: str
    content: str


def auxiliary_call(*, agent: Agent, request: CompiledRequest, kind: str, turn: Turn | None = None) -> tuple[InferenceCall, CallResult]:
    """Make one non-streamed call (an auxiliary completion or the breaker's probe) under the
    non-streamed bounds, with no retries, and record it. Blocks the calling thread; call it off
    any event loop, after the admission check."""
    adapter, wire = build_wire(agent.provider, request)
    call = InferenceCall.objects.create(
        turn=turn, agent=agent, kind=kind, model=request.model, streamed=False,
        max_tokens=request.max_tokens, round=turn.rounds if turn else 0, sent_at=timezone.now(),
    )
    dashboard_call_started(call=call, agent=agent.name)
    loop = background_loop()
    result = loop.submit(
        perform_call(adapter=adapter, wire=wire, streamed=False, max_tokens=request.max_tokens,
                     bounds=bounds_settings(), client=loop.http)
    ).result()
    call_record(call, result)
    dashboard_call_ended(call=call, agent=agent.name, result=result)
    call.refresh_from_db()
    return call, result


def auxiliary_complete_in_thread(**kwargs: Any) -> dict[str, Any]:
    """``auxiliary_complete`` for a worker thread of its own: gives its connection back."""
    from django.db import connection

    try:
        return auxiliary_complete(**kwargs)
    finally:
        connection.close()


def auxiliary_complete(*, agent: Agent, messages: list[AuxMessage], model: str | None, max_tokens: int | None) -> dict[str, Any]:
    """Make one non-streamed auxiliary call. Blocks the calling thread until it ends (run it
    off the event loop). Raises RateLimited (deferred or refused), CallTimedOut, ProviderFailed."""
    from waits.admission import admission_check, remaining_ms
    from waits.services import wait_record

    model = model or agent.model
    now_ms = time.time() * 1000
    hold = admission_check(agent=agent, model=model, now_ms=now_ms)
    if hold is not None:
        InferenceCall.objects.create(
            agent=agent, kind=InferenceCall.Kind.AUXILIARY, model=model, streamed=False, max_tokens=max_tokens,
            sent_at=timezone.now(), ended_at=timezone.now(), outcome=InferenceCall.Outcome.DEFERRED,
        )
        left = remaining_ms(hold, now_ms)
        until = ms_to_dt(hold.until_ms)
        raise RateLimited(
            f"{agent.name} / {hold.model} is held by a provider wait ({hold.reason}); no call was made",
            data={"retryable": True, "provider_admission": "deferred", "retry_after_ms": left,
                  "until": until.isoformat() if until else None},
        )
    request = CompiledRequest(
        model=model, system=agent.system, max_tokens=max_tokens or agent.max_tokens, stream=False,
        messages=[Message(role="user", blocks=[{"type": "text", "text": f"{m.participant}: {m.content}"}]) for m in messages],
    )
    call, result = auxiliary_call(agent=agent, request=request, kind=InferenceCall.Kind.AUXILIARY)
    if result.outcome == "completed" and result.output is not None:
        return {"content": result.output.text, "stop_reason": result.output.stop_reason, "call": call_out(call)}
    error = result.error
    assert error is not None
    if result.outcome == "cut":
        raise CallTimedOut(error.message, data={"bound": error.bound, "call": call.pk})
    if error.retry_after_ms is not None:
        recorded = wait_record(agent=agent, model=model, retry_after_ms=error.retry_after_ms,
                               reason=f"{error.type} (HTTP {error.http_status}): {error.message[:300]}", now_ms=time.time() * 1000)
        wait = error.retry_after_ms if math.isfinite(error.retry_after_ms) else None
        raise RateLimited(error.message, data={"retryable": error.retryable, "provider_admission": "refused",
                                              "retry_after_ms": wait, "recorded": recorded.binding, "call": call.pk})
    raise ProviderFailed(error.message, data={**error.as_dict(), "call": call.pk})
