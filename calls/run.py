"""Running one provider call on the process's background loop.

How a turn's primary call (``turns.drain``, a coroutine on that loop) and the
breaker's probe (``breaker.probe_call``, submitted to the loop by a thread that waits) are made. (The ``complete``
endpoint's and the drop-in endpoints' auxiliary calls run on their request's own event loop
instead: ``turns.auxiliary``, ``turns.dropin``.) The call's I/O (the socket,
the stream reader, the deadline timer) is a coroutine on the process's one loop
(``agentops.background``); its row is written in the bookkeeping pool, before the call is sent
and after it ends, and nothing waits on a thread while it is out: a cancel, the loss of what it
is made under (``holding``) or a warm shutdown wakes it on the loop and aborts it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol
from urllib.parse import urlsplit

from django.utils import timezone

from agentops import lifecycle, rows, telemetry
from agentops.background import BackgroundLoop, LoopWake, background_loop, bookkeeping
from agentops.lifecycle import Wake
from agentops.live import broadcast_turn_event, publish_turn_event
from agentops.models import Agent
from agentops.outbound import proxy_configured
from agentops.providers import base_url_vet, key_env_problem, key_missing
from agentops.text import bound_text
from agentops.urlsafety import HostUnresolved, IPAddress
from calls.adapters import Adapter, WireRequest, build_wire
from calls.bounds import Deadline
from calls.classify import redacted
from calls.client import CallResult, Timeline, now_ms, perform_call
from calls.config import bounds_settings
from calls.events import dashboard_call_ended, dashboard_call_started
from calls.health import provider_health_note
from calls.progress import progress_entry, progress_hub
from calls.records import call_record
from calls.tracing import attempt_traced
from calls.types import CompiledRequest, ProviderError
from inference.models import InferenceCall, Turn

logger = logging.getLogger(__name__)

# What a call's start gives: its adapter, its wire request, its row, and the result of a call
# the provider policy refused (None: send it).
Begun = tuple[Adapter, WireRequest, InferenceCall, CallResult | None]


class Holding(Protocol):
    """What a call is made under and must stop without (a turn's lease): kept alive by someone
    else (the process's lease renewer), it wakes a waiting call when it is lost."""

    @property
    def lost(self) -> bool: ...

    def wake_on_loss(self, event: Wake) -> Callable[[], None]:
        """Set ``event`` once lost (at once if it is); returns the undo."""
        ...


async def call_run_on_loop(
    *,
    agent: Agent,
    request: CompiledRequest,
    kind: str,
    turn: Turn | None = None,
    abort_key: str | None = None,
    holding: Holding | None = None,
    abort_on_shutdown: bool = True,
    turn_events: bool = False,
    on_result: Callable[[CallResult], None] | None = None,
    record: Callable[[Callable[[], None]], None] | None = None,
    then: Callable[[CallResult], None] | None = None,
    begun: Begun | None = None,
) -> tuple[InferenceCall, CallResult]:
    """Make one call under the bounds (``request.stream`` says streamed or not), with no
    retries, and record it on its ``InferenceCall`` row, which is written before the call is
    sent. A coroutine on the background loop; ``agent`` comes with its provider loaded, and
    the admission check was made. Returns the row as created (``call_record`` wrote the rest:
    refresh it to read the recorded instants) and the result.

    The call is aborted (outcome ``aborted``) when the Redis key ``abort_key`` appears, when
    ``holding`` is lost, and, with ``abort_on_shutdown``, when the worker's warm shutdown
    begins (a turn's primary call is left to end: the worker waits for it). With
    ``turn_events``, the turn's websocket gets ``call.started``, ``call.delta`` and
    ``call.ended``.

    Decide before you write: ``on_result`` gets the result as soon as the call ends, before
    any of it is written (a turn hands a stated wait to the journal there), and ``record``
    runs the write of the call's row (a turn retries it while the database is down); both run
    in the bookkeeping pool. ``then`` runs in that same hop once the row is written and the
    call's ``call.ended`` is sent (a turn stores its answer there: one hop, not two).

    ``begun`` is what ``call_begin`` gave for this call, when the caller ran it in a hop of its
    own bookkeeping just before (a turn does, with its claim); else it runs here."""
    if begun is None:
        begun = await bookkeeping(call_begin, agent, request, kind, turn)
    adapter, wire, call, refused = begun
    turn_id = turn.pk if turn is not None and turn_events else None
    result = refused or await _perform(
        adapter=adapter, wire=wire, call=call, agent=agent, request=request, turn_id=turn_id,
        abort_key=abort_key, holding=holding, abort_on_shutdown=abort_on_shutdown,
    )
    await bookkeeping(_call_end, call, agent, result, turn_id, on_result, record, then)
    return call, result


def call_begin(agent: Agent, request: CompiledRequest, kind: str, turn: Turn | None) -> Begun:
    """Start a call, in the bookkeeping pool, just before it is sent: its wire request, the
    provider policy, its row (``sent_at`` now) and the dashboard's ``call.started``."""
    adapter, wire = build_wire(agent.provider, request)
    # The provider policy again, before every call: the settings, or what the host resolves
    # to, may have changed since the provider was created. A refused call ends at once, as an
    # error (not retryable), with its row and its call.ended like any other.
    wire, refused = provider_vetted(agent, wire)
    call = rows.insert(InferenceCall(
        turn=turn, agent=agent, kind=kind, model=request.model, streamed=request.stream,
        max_tokens=request.max_tokens, round=turn.rounds if turn else 0, sent_at=timezone.now(),
    ))
    dashboard_call_started(call=call, agent=agent.name)
    return adapter, wire, call, refused


def _call_end(
    call: InferenceCall, agent: Agent, result: CallResult, turn_id: int | None,
    on_result: Callable[[CallResult], None] | None, record: Callable[[Callable[[], None]], None] | None,
    then: Callable[[CallResult], None] | None,
) -> None:
    if on_result is not None:
        on_result(result)
    if record is not None:
        record(lambda: call_record(call, result))
    else:
        call_record(call, result)
    if turn_id is not None:
        broadcast_turn_event(turn_id, {"type": "call.ended", "turn": turn_id, "call": call.pk, "outcome": result.outcome})
    dashboard_call_ended(call=call, agent=agent.name, result=result)
    if telemetry.enabled:
        attempt_traced(agent=agent, call=call, result=result)
    if then is not None:
        then(result)
    provider_health_note(provider=agent.provider, result=result)


async def _perform(
    *, adapter: Adapter, wire: WireRequest, call: InferenceCall, agent: Agent, request: CompiledRequest,
    turn_id: int | None, abort_key: str | None, holding: Holding | None, abort_on_shutdown: bool,
) -> CallResult:
    engine = background_loop()
    hooks = _Hooks(engine, call, agent.name, turn_id, abort_key, holding, abort_on_shutdown)
    try:
        return await perform_call(
            adapter=adapter, wire=wire, streamed=request.stream, max_tokens=request.max_tokens,
            bounds=bounds_settings(), on_abortable=hooks.on_abortable,
            on_milestone=hooks.on_milestone, on_delta=hooks.on_delta, on_progress=hooks.on_progress,
        )
    finally:
        hooks.hub.ended(call.pk)
        for step in hooks.undo:
            step()


class _Hooks:
    """What a turn's or an auxiliary call's reading tells the rest of the service: its cancel
    watch and wakes, its live events, its entry on the dashboard. (Methods rather than
    closures: a worker holds thousands of calls at once.)"""

    __slots__ = ("abort_key", "abort_on_shutdown", "agent_name", "call", "deadline", "engine", "firsts", "holding", "hub", "timeline", "turn_id", "undo")

    def __init__(
        self, engine: BackgroundLoop, call: InferenceCall, agent_name: str, turn_id: int | None,
        abort_key: str | None, holding: Holding | None, abort_on_shutdown: bool,
    ) -> None:
        self.engine, self.call, self.agent_name, self.turn_id = engine, call, agent_name, turn_id
        self.abort_key, self.holding, self.abort_on_shutdown = abort_key, holding, abort_on_shutdown
        self.undo: list[Callable[[], None]] = []
        self.hub = progress_hub()
        self.firsts = (False, False)  # first event, first content: sent at once
        self.timeline: Timeline | None = None
        self.deadline: Deadline | None = None

    def on_abortable(self, abort: Callable[[], None]) -> None:
        if self.abort_key is not None:
            self.undo.append(self.engine.watch_cancel(self.abort_key, abort))
        # Woken from another thread (the renewer that found the lease taken, a warm shutdown).
        wake = LoopWake(self.engine.loop)
        wake.future.add_done_callback(lambda _: abort())
        if self.holding is not None:
            self.undo.append(self.holding.wake_on_loss(wake))
        if self.abort_on_shutdown:
            lifecycle.wake_on_shutdown(wake)
            self.undo.append(lambda: lifecycle.forget(wake))

    async def on_milestone(self, name: str, timeline: Timeline) -> None:
        if name == "sent" and self.turn_id is not None:
            call = self.call
            publish_turn_event(self.turn_id, {"type": "call.started", "turn": self.turn_id, "call": call.pk, "model": call.model, "streamed": call.streamed})

    async def on_delta(self, text: str) -> None:
        if self.turn_id is not None:
            publish_turn_event(self.turn_id, {"type": "call.delta", "turn": self.turn_id, "call": self.call.pk, "text": text})

    def on_progress(self, timeline: Timeline, deadline: Deadline | None) -> None:
        firsts = (timeline.first_event is not None, timeline.first_content is not None)
        urgent, self.firsts = firsts != self.firsts, firsts
        self.timeline, self.deadline = timeline, deadline
        self.hub.update(self.call.pk, self, urgent=urgent)

    def progress(self) -> dict[str, Any]:
        """The call's progress as it stands (the hub reads it when it flushes)."""
        assert self.timeline is not None
        call = self.call
        return progress_entry(call_id=call.pk, agent=self.agent_name, turn_id=call.turn_id, timeline=self.timeline, deadline=self.deadline)


def provider_vetted(agent: Agent, wire: WireRequest) -> tuple[WireRequest, CallResult | None]:
    """The provider policy at call time (every call path asks it before sending): ``wire``
    pinned to the address the check resolved, and None; or, when the policy refuses the call,
    the result of a call that was never sent (an error, not retryable). Blocks on DNS: call
    it off any event loop."""
    checked = _provider_check(agent)
    if isinstance(checked, ProviderError):
        at = now_ms()
        return wire, CallResult(outcome="error", timeline=Timeline(sent=at, ended=at), error=checked)
    return (replace(wire, addresses=checked) if checked else wire), None


def _provider_check(agent: Agent) -> ProviderError | tuple[IPAddress, ...] | None:
    """The provider policy at call time: the addresses to connect to, or the error that ends
    the call without sending it (None: nothing to pin, e.g. the host is an address)."""
    provider = agent.provider
    host = urlsplit(provider.base_url).hostname
    try:
        vetted = base_url_vet(provider.base_url, unresolved_refused=False)
    except HostUnresolved as exc:
        if proxy_configured(provider.base_url):
            return None  # behind a proxy the name may resolve only there: the proxy connects
        logger.warning("provider %s: %s", provider.name, exc)
        return ProviderError(type="network", message=bound_text(redacted(str(exc), host)), retryable=True)
    problem = f"base_url: {vetted.refusal}" if vetted.refusal else None
    key_problem = key_env_problem(provider.api_key_env) or key_missing(provider.api_key_env)
    if problem is None and key_problem:
        problem = f"api_key_env: {key_problem}"
    if problem is not None:
        logger.warning("provider %s is refused by the provider policy: %s", provider.name, problem)
        return ProviderError(
            type="auth", provider_code="provider_refused", retryable=False,
            message=bound_text(redacted(f"provider {provider.name!r} is refused by the service's provider policy, so no call was made: {problem}", host)),
        )
    return vetted.addresses or None


def call_deferred(*, agent: Agent, kind: str, model: str, max_tokens: int | None, turn: Turn | None = None) -> InferenceCall:
    """The row of an auxiliary call or probe that a binding wait refused without a call
    (DESIGN §6.6, outcome ``deferred``): every such call has its row, as a made call does."""
    now = timezone.now()
    return InferenceCall.objects.create(
        turn=turn, agent=agent, kind=kind, model=model, streamed=False, max_tokens=max_tokens,
        round=turn.rounds if turn else 0, sent_at=now, ended_at=now, outcome=InferenceCall.Outcome.DEFERRED,
    )
