"""Auxiliary completions (API.md ``POST /agents/{name}/complete``, DESIGN §6.6).

An auxiliary call to a held model is refused without a call: a retryable ``rate_limit``
carrying the remaining wait and ``provider_admission: "deferred"``, so a pacing caller does not
count it as a failed call. A wait the provider states here is recorded and holds the agent's
primary turns too.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.utils import timezone

from agentops import lifecycle
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


def auxiliary_call(
    *, agent: Agent, request: CompiledRequest, kind: str, turn: Turn | None = None,
    abort_key: str | None = None, keep_going: Callable[[], bool] | None = None,
    waiting: Callable[[], AbstractContextManager[None]] = nullcontext,
) -> tuple[InferenceCall, CallResult]:
    """Make one non-streamed call (an auxiliary completion or the breaker's probe) under the
    non-streamed bounds, with no retries, and record it. Blocks the calling thread; call it off
    any event loop and outside any transaction, after the admission check.

    The call is aborted (outcome ``aborted``) when the process's warm shutdown begins, when the
    Redis key ``abort_key`` appears, or when ``keep_going`` (called every few seconds while
    the call is out, e.g. to renew a lease) returns False. ``waiting`` wraps the wait."""
    adapter, wire = build_wire(agent.provider, request)
    call = InferenceCall.objects.create(
        turn=turn, agent=agent, kind=kind, model=request.model, streamed=False,
        max_tokens=request.max_tokens, round=turn.rounds if turn else 0, sent_at=timezone.now(),
    )
    dashboard_call_started(call=call, agent=agent.name)
    loop = background_loop()
    aborts: list[Callable[[], None]] = []
    unwatch: list[Callable[[], None]] = []

    def on_abortable(abort: Callable[[], None]) -> None:
        aborts.append(abort)
        if abort_key is not None:
            unwatch.append(loop.watch_cancel(abort_key, abort))

    future = loop.submit(
        perform_call(adapter=adapter, wire=wire, streamed=False, max_tokens=request.max_tokens,
                     bounds=bounds_settings(), client=loop.http, on_abortable=on_abortable)
    )
    ended = threading.Event()  # by the call's end, or by the worker's warm shutdown
    future.add_done_callback(lambda _: ended.set())
    lifecycle.wake_on_shutdown(ended)
    try:
        with waiting():
            while not ended.wait(_tick_s()):
                if keep_going is not None and not keep_going():
                    break
        if not future.done():
            for abort in aborts:
                loop.loop.call_soon_threadsafe(abort)
        result = future.result()
    finally:
        lifecycle.forget(ended)
        for stop_watching in unwatch:
            loop.loop.call_soon_threadsafe(stop_watching)
    call_record(call, result)
    dashboard_call_ended(call=call, agent=agent.name, result=result)
    call.refresh_from_db()
    return call, result


def _tick_s() -> float:
    """How often a call's waiting thread asks ``keep_going``: as often as a turn lease's renewal
    falls due, and at least every 2 s."""
    return min(2.0, settings.AGENTOPS_TURN_LEASE_MS / 4000)


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
