"""Running one provider call: ``ProviderCall``, the one runner every path uses (a turn's call
in ``turns.drain``, the breaker's probe in ``breaker.probe_call``, ``complete`` in
``turns.auxiliary`` and the drop-in endpoints in ``turns.dropin``).

Every caller composes it the same way: ``result = await call.run(...)`` (``begin`` in the
runtime's database threads: it may resolve DNS and write the row; then ``perform`` on the
running loop: the socket, the stream reader, the deadline timer), then ``end`` in a database
hop of its own (the row's record and the call's end announced), after whatever it must decide
first (a turn records a stated wait before the row). Nothing of the caller's runs inside them:
each returns what happened and the caller decides what follows (an answer stored, an error
raised).

Its row is written in one place (``_row_write``): before the call is sent when it is shown in
flight (``begin(in_flight=True)``: a turn's call, a probe, a streamed drop-in call), else once,
with its outcome, when it ends; a call that a binding wait refused gets its row too
(``ProviderCall.deferred``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, replace
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from agentops import rows, telemetry
from agentops.budgets import Reserved, budget_settle
from agentops.live import broadcast_turn_event
from agentops.models import Agent, Provider
from agentops.prices import PriceBook
from calls.adapters import Adapter, WireRequest, build_wire
from calls.bounds import BoundsSettings, ShorterBeforeContent
from calls.budgeting import OUTPUT_BOUND, call_reservation
from calls.client import CallResult
from calls.config import bounds_settings
from calls.engine import CallRuntime
from calls.events import dashboard_call_ended, dashboard_call_started
from calls.gate import call_gated, provider_vetted, quota_told, slot_kept, token_estimate
from calls.health import provider_health_note
from calls.limits import Quota
from calls.project_limits import Taken
from calls.reading import perform_call
from calls.records import call_cost_fields, stored
from calls.tracing import attempt_traced
from calls.types import CompiledRequest
from calls.watch import Hooks, Watch
from inference.models import InferenceCall, Turn
from inference.routes import RouteKind

OnWire = Callable[[str, Any], Awaitable[None]]
# How a caller runs blocking work from the loop (``Runtime.db``, or a durable variant of it).
Hop = Callable[[Callable[[], None]], Awaitable[None]]


class ProviderCall:
    """One provider call from its row to its end, with no retries. ``agent`` comes with its
    provider loaded and the admission check made. ``body`` and ``headers`` replace the wire
    request's body and add to its headers (a drop-in call sends the client's own body).
    ``provider`` serves it (the agent's own unless an alternate does: architecture.md §6.11),
    ``route`` says why, on its row (``route_kind``: the same as a value).
    ``first_content_bound``: (ms, the setting that names it), a before-content bound shorter
    than the configured one for this call alone (§6.11). ``engine``: the process's runtime,
    whose gate, progress hub and prices the call goes through."""

    __slots__ = (
        "_aborts",
        "_announced",
        "_taken",
        "adapter",
        "agent",
        "body",
        "engine",
        "first_content_bound",
        "headers",
        "kind",
        "provider",
        "refused",
        "request",
        "reserved",
        "result",
        "row",
        "spares",
        "turn",
        "watch",
        "wire",
    )

    def __init__(
        self,
        engine: CallRuntime,
        agent: Agent,
        request: CompiledRequest,
        kind: str,
        *,
        turn: Turn | None = None,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
        provider: Provider | None = None,
        route: str = "primary",
        route_kind: RouteKind = RouteKind.PRIMARY,
        spares: Sequence[tuple[Provider, str]] = (),
        first_content_bound: tuple[float, str] | None = None,
    ) -> None:
        self.engine = engine
        self.agent, self.request, self.kind, self.turn = agent, request, kind, turn
        self.first_content_bound = first_content_bound
        # Pool members that may take the call instead, when its quota has none left before
        # they do (architecture.md §6.15): (provider, model), in the order to try them.
        self.spares = tuple(spares)
        self.provider = provider if provider is not None else agent.provider
        self.body, self.headers = body, headers or {}
        self.row = InferenceCall(
            turn=turn,
            agent=agent,
            kind=kind,
            model=request.model,
            provider=self.provider,
            route=route,
            route_kind=route_kind,
            streamed=request.stream,
            max_tokens=request.max_tokens,
            round=turn.rounds if turn else 0,
        )
        self.adapter: Adapter
        self.wire: WireRequest
        self.refused: CallResult | None = None
        self.reserved: list[Reserved] = []
        self.result: CallResult | None = None
        self.watch: Watch | None = None
        self._aborts: list[Callable[[], None]] = []
        self._announced = False
        self._taken: Taken | None = None  # what it took from its project's limits (§6.14)

    def begin(self, *, in_flight: bool = True) -> None:
        """In a thread, just before the call is sent: its wire request and the provider policy
        (which may resolve DNS); ``in_flight``: its row written now (``sent_at`` now) and the
        dashboard's ``call.started``."""
        self.adapter, wire = build_wire(self.provider, self.request)
        # The provider policy again, before every call: the settings, or what the host resolves
        # to, may have changed since the provider was created. A refused call ends at once, as
        # an error (not retryable), with its row and its call.ended like any other.
        wire, self.refused = provider_vetted(self.provider, wire)
        if self.body is not None:
            wire = replace(wire, body=self.body)
        if self.headers:
            wire = replace(wire, headers={**wire.headers, **self.headers})
        self.wire = wire
        if self.refused is None:
            self.refused = self._budget_reserved()
        if in_flight:
            _row_write(self.row, {"sent_at": timezone.now()})
            dashboard_call_started(call=self.row, agent=self.agent.name)

    def _budget_reserved(self) -> CallResult | None:
        """The call's estimate reserved on its budgets (architecture.md §18), or, when a
        budget refuses it, the result of a call never sent. A reserved call without an output
        bound is sent with the one it reserved for."""
        reservation = call_reservation(
            self.engine.prices,
            agent=self.agent,
            provider_id=self.provider.pk,
            provider_kind=self.provider.kind,
            model=self.request.model,
            body=self.wire.body,
            max_tokens=self.request.max_tokens,
            look_elsewhere=self.kind != InferenceCall.Kind.PROBE,  # a probe tests its own model
            now=timezone.now(),
        )
        self.reserved = reservation.reserved
        if reservation.reserved and reservation.estimate is not None:
            self.row.reserved = reservation.estimate.amount
            self.row.input_estimate = reservation.input_estimate
        if reservation.max_tokens is not None:
            field = OUTPUT_BOUND[self.provider.kind]
            self.wire = replace(self.wire, body={**self.wire.body, field: reservation.max_tokens})
            self.row.max_tokens = reservation.max_tokens
        return reservation.refused

    async def run(
        self,
        *,
        in_flight: bool = True,
        watch: Watch | None = None,
        on_wire: OnWire | None = None,
        hop: Hop | None = None,
        pace_max_ms: float | None = None,
    ) -> CallResult:
        """Paced (``paced``), then ``begin`` in a database hop (``hop``: the runtime's ``db``
        unless the caller waits out an outage), then ``perform``. The caller ends the call
        (``end``) once it decided. A call that ``pace_max_ms`` would not wait for comes back
        ``paced`` (never sent; its row is ``deferred``). Its project's slot, if it took one, is
        held until it returns."""
        refused = await self.paced(pace_max_ms)
        if refused is not None:
            self.result = refused
            return refused
        async with slot_kept(self.engine, self._taken):
            begin = partial(self.begin, in_flight=in_flight)
            await (hop(begin) if hop is not None else self.engine.db(begin))
            return await self.perform(watch=watch, on_wire=on_wire)

    async def paced(self, max_wait_ms: float | None) -> CallResult | None:
        """Wait until its project's limits and the provider's quota have room for this call
        (``calls.gate``, architecture.md §6.13 to §6.15), moved to a pool member with room first
        when one has; past ``max_wait_ms``, the result of a call never sent (``paced``)."""
        gated = await call_gated(
            self.engine,
            project_id=self.agent.project_id,
            provider=self.provider,
            model=self.request.model,
            spares=self.spares,
            tokens=partial(token_estimate, self.request, self.body),
            max_wait_ms=max_wait_ms,
        )
        self._taken = gated.taken
        if gated.waited_ms:
            self.row.paced_ms = (self.row.paced_ms or 0) + round(gated.waited_ms)
        if gated.moved is not None:
            self._moved_to(*gated.moved)
        return gated.refused

    def _moved_to(self, provider: Provider, model: str) -> None:
        """Before it is sent: the call goes to another pool member (its row says so)."""
        self.provider = provider
        self.request = replace(self.request, model=model)
        self.row.provider, self.row.model = provider, model
        if self.body is not None:
            self.body = {**self.body, "model": model}
        self.spares = ()

    def _quota_noted(self, quota: Quota | None) -> None:
        quota_told(self.engine, self.provider.name, self.request.model, quota)

    async def perform(
        self, *, watch: Watch | None = None, on_wire: OnWire | None = None
    ) -> CallResult:
        """Make the call (``request.stream`` says streamed or not) under the bounds, or end it
        at once when the provider policy refused it. ``on_wire`` gets what the provider sent, as
        it arrives (a drop-in call relays it)."""
        self.watch = watch
        if self.refused is not None:
            self.result = self.refused
            return self.refused
        hooks = (
            Hooks(self.engine, self.row, self.agent.name, self._aborts, watch)
            if watch is not None
            else None
        )
        try:
            self.result = await perform_call(
                adapter=self.adapter,
                wire=self.wire,
                streamed=self.request.stream,
                max_tokens=self.request.max_tokens,
                bounds=self._bounds(),
                on_abortable=hooks.on_abortable if hooks else self._aborts.append,
                on_milestone=hooks.on_milestone if hooks else None,
                on_delta=hooks.on_delta if hooks else None,
                on_progress=hooks.on_progress if hooks else None,
                on_wire=on_wire,
                on_quota=self._quota_noted,
            )
        finally:
            if hooks is not None:
                hooks.ended()
        return self.result

    def _bounds(self) -> BoundsSettings | None:
        bounds, shorter = bounds_settings(), self.first_content_bound
        if bounds is None or shorter is None or shorter[0] >= bounds.before_content_ms:
            return bounds
        return ShorterBeforeContent(
            **{**asdict(bounds), "before_content_ms": shorter[0]}, before_content_setting=shorter[1]
        )

    def abort(self) -> None:
        """End the call being performed (the client went away): it is recorded ``aborted``."""
        for abort in self._aborts:
            abort()

    def record(self) -> InferenceCall:
        """In a thread, once the call ended: its row written with the result (created now when
        the call was not shown in flight). Safe to run again: a turn retries it while the
        database is down."""
        assert self.result is not None
        row = self.row

        def write(fields: dict[str, Any]) -> InferenceCall:
            # Billed at what served it: the row's provider and model (an alternate's). The
            # cost replaces the call's reservations in the same transaction: the ledger is
            # the sum of the rows.
            cost = call_cost_fields(
                self.engine.prices, provider_id=row.provider_id, model=row.model, fields=fields
            )
            if not self.reserved:  # no budget counts it: one statement, as every row was
                return _row_write(row, {**fields, **cost})
            with transaction.atomic():
                _row_write(row, {**fields, **cost})
                budget_settle(reserved=self.reserved, cost=cost["cost"], agent=self.agent.name)
            return row

        stored(write, self.result)
        self.reserved = []  # settled once: a record run again does not settle twice
        if self._taken is not None:  # the project's tokens corrected by what was used
            usage = self.result.usage
            used = 0 if self.result.outcome == InferenceCall.Outcome.DEFERRED else None
            if usage is not None and usage.input_tokens is not None:
                used = usage.input_tokens + (usage.output_tokens or 0)
            if used is not None:
                self.engine.limiter.tokens_used(self._taken, used)
            self._taken = replace(self._taken, tokens=used if used is not None else 0, slot=None)
        # What is left was told as the answer's head arrived (``_quota_noted``), not again here.
        return row

    def announce(self) -> None:
        """In a thread, once recorded: the call's end told to the turn's websocket, the
        dashboard, the provider's health and the traces. Once: a hop run again after the
        database dropped (``Runtime.db_durably``) does not tell it twice."""
        if self._announced:
            return
        self._announced = True
        result, call, agent = self.result, self.row, self.agent
        assert result is not None
        if self.watch is not None and self.watch.turn_events and call.turn_id is not None:
            broadcast_turn_event(
                call.turn_id,
                {
                    "type": "call.ended",
                    "turn": call.turn_id,
                    "call": call.pk,
                    "outcome": result.outcome,
                },
            )
        dashboard_call_ended(call=call, agent=agent.name, result=result)
        if telemetry.enabled:  # under the span current in this thread (a drop-in request's, say)
            attempt_traced(agent=agent, call=call, result=result, served_by=self.provider)
        provider_health_note(provider=self.provider, result=result)

    def end(self) -> InferenceCall:
        """``record`` then ``announce``, in one hop."""
        self.record()
        self.announce()
        return self.row

    @staticmethod
    def deferred(
        prices: PriceBook,
        *,
        agent: Agent,
        kind: str,
        model: str,
        max_tokens: int | None,
        turn: Turn | None = None,
    ) -> InferenceCall:
        """The row of an auxiliary call or probe that a binding wait refused without a call
        (architecture.md §6.6, outcome ``deferred``): every such call has its row, as a made call
        does."""
        now = timezone.now()
        row = InferenceCall(
            turn=turn,
            agent=agent,
            kind=kind,
            model=model,
            provider_id=agent.provider_id,
            route="primary",
            streamed=False,
            max_tokens=max_tokens,
            round=turn.rounds if turn else 0,
        )
        return _row_write(
            row,
            {
                "sent_at": now,
                "ended_at": now,
                "outcome": InferenceCall.Outcome.DEFERRED,
                **call_cost_fields(prices, provider_id=row.provider_id, model=model, fields={}),
            },
        )


def _row_write(row: InferenceCall, fields: dict[str, Any]) -> InferenceCall:
    """The one place a call's row is written: inserted when it has none yet, else updated."""
    for name, value in fields.items():
        setattr(row, name, value)
    if row.pk is None:
        rows.insert(row)
    else:
        rows.update(InferenceCall, row.pk, **fields)
    return row
