"""Drop-in calls (architecture.md §14): a client's own request body, in its provider's wire format, sent
to an agent's provider as an auxiliary call (architecture.md §6.6).

Admission first: a held model is refused without a call (a ``deferred`` row). Then the body
goes out with only ``model`` replaced (and the agent's ``max_tokens`` when the request sets
none), on the request's own event loop, read under the progress bounds like every call; each
event is handed to the caller as it arrives (``DropinCall.arrived``) so it can relay it. When the
call ends its row gets its timeline and usage, and a wait the provider stated is recorded for
(agent, model) and holds the agent's turns too. The agent's history is not touched.

A transient failure before the provider's response started is absorbed here (architecture.md
§14.1): a stated wait of at most ``AGENTOPS_FALLBACK_AFTER_MS`` is waited out and the call made
again; a 5xx or a network failure is made again once after a jitter. Each attempt is a call of
its own with its own row; what a failed attempt sent is never handed to the caller. Once the
response started (any event, or a body) nothing is made again: 2xx headers alone are held back
with the rest, so a provider that answers headers and then stays silent is cut and routed around
within the request, like a refusal before headers.

No database connection is held while the provider is waited on: each piece of bookkeeping runs
in the runtime's database threads (``Runtime.db``), which in the web give it back when done.
"""

from __future__ import annotations

import asyncio
import math
import time
from functools import partial
from typing import Any

from django.conf import settings

from agentops.models import Agent
from calls.client import CallResult
from calls.engine import CallRuntime
from calls.run import ProviderCall
from calls.types import CompiledRequest
from inference.models import InferenceCall
from turns.auxiliary import Deferred, auxiliary_admit
from turns.dropin_attempts import (
    Attempt,
    again_after_ms,
    as_called,
    attempt_key,
    dropin_hedge,
    dropin_target,
    jitter_ms,
)
from turns.episodes import serving_settled
from turns.targets import routed, wait_provider
from waits.admission import admission_check, remaining_ms
from waits.limits import limit_record

# The field that bounds a reply's length in each wire format's request.
MAX_TOKENS_FIELD = {
    "openai": "max_tokens",
    "anthropic": "max_tokens",
    "openai-responses": "max_output_tokens",
}
# Request headers of the client's that go on to the provider (the Anthropic SDK's version and
# betas; everything else, its key above all, stays here).
FORWARDED_HEADERS = ("anthropic-version", "anthropic-beta")
# The most of what the provider sent that waits for the client, in items (events): past it
# the call reads no further until the client takes some, so a client slower than its
# provider holds the provider back rather than the process's memory growing.
QUEUE_ITEMS = 64
# A stated wait is checked against the journal again after it was slept; a hold that some
# process lengthened meanwhile (to at most the threshold) is slept again at most this often.
WAIT_RECHECKS = 2


def request_max_tokens(kind: str, body: dict[str, Any]) -> int | None:
    for field in (MAX_TOKENS_FIELD[kind], "max_completion_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class DropinCall:
    """One drop-in request and the calls it makes. ``admit()`` (in a thread), then ``start()``
    (on the loop); ``await arrived()`` until ``("end", result)``, or ``abort()``: before it
    come ``("headers", status)``, ``("sse", event)``, ``("body", bytes)`` and ``("error_body",
    (status, headers, bytes))`` as the provider sent them, for the attempt that answers (a
    failed attempt that is made again hands nothing on). The call reads on as they are taken
    (QUEUE_ITEMS wait at most).

    A streamed call's row is written before it is sent (the dashboard shows it in flight) and
    completed when it ends; a call that is not streamed has its row written once, when it
    ends, with its outcome. Every attempt has its own row; ``call`` is the last one. ``rt``:
    the process's runtime, each attempt's database hops and gate."""

    def __init__(
        self, rt: CallRuntime, *, agent: Agent, body: dict[str, Any], headers: dict[str, str]
    ) -> None:
        kind = agent.provider.kind
        self.rt = rt
        self.agent = agent
        self.streamed = body.get("stream") is True
        self.max_tokens = request_max_tokens(kind, body) or agent.max_tokens
        self.body = dict(body)
        if self.max_tokens and not request_max_tokens(kind, body):
            self.body[MAX_TOKENS_FIELD[kind]] = self.max_tokens
        self.headers = {k: v for k, v in headers.items() if k in FORWARDED_HEADERS}
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        # Set while the queue has room; the end goes in regardless, so it never waits for a
        # client that is gone.
        self._room = asyncio.Event()
        self._room.set()
        self._abandoned = False  # the client went away: nobody takes from the queue
        self._gone: asyncio.Event | None = None  # set on abort: a wait between attempts ends
        self.call: InferenceCall | None = None
        self.result: CallResult | None = None
        self.target = Attempt(agent.provider, agent.model)
        self._call = self._attempt(self.target)
        # A hedge's second call while it races the first (§6.11); at most one per request.
        self._hedge: ProviderCall | None = None
        self._hedged = False
        self._task: asyncio.Task[None] | None = None

    def _attempt(self, target: Attempt) -> ProviderCall:
        """One attempt's call: the adapter's URL and headers (the provider's key), with the
        client's own body naming ``target.model``."""
        request = CompiledRequest(
            model=target.model,
            system="",
            messages=[],
            max_tokens=self.max_tokens,
            stream=self.streamed,
        )
        return ProviderCall(
            self.rt,
            self.agent,
            request,
            InferenceCall.Kind.AUXILIARY,
            body={**self.body, "model": target.model},
            headers=self.headers,
            provider=target.provider,
            route=target.choice.reason,
            route_kind=target.choice.kind,
            spares=target.spares,
            first_content_bound=target.first_content_bound,
        )

    def admit(self) -> Deferred | None:
        """None when the call may go out; else the hold (its ``deferred`` row is written).
        Reads the database: call it in a thread. With alternates, the target is chosen here."""
        chosen = dropin_target(self.rt.pacer, self.agent, set())
        if chosen is not None:  # chosen from the journal's view: nothing holds it
            self.target, self._call = chosen, self._attempt(chosen)
            return None
        return auxiliary_admit(
            self.rt, agent=self.agent, model=self.target.model, max_tokens=self.max_tokens
        )

    def start(self) -> None:
        self._gone = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def arrived(self) -> list[tuple[str, Any]]:
        """What the provider sent since the last look, in order, the end last (waits for one
        item at least): many small events are relayed as one write."""
        items = [await self._queue.get()]
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        self._room.set()
        return items

    def abort(self) -> None:
        """End the call (the client went away): it is recorded as ``aborted``, and no other
        attempt is made."""
        self._abandoned = True
        self._room.set()
        if self._gone is not None:
            self._gone.set()
        self._call.abort()
        if self._hedge is not None:
            self._hedge.abort()

    async def _run(self) -> None:
        retries = settings.AGENTOPS_DROPIN_RETRIES
        attempt = 0
        held: list[tuple[str, Any]] = []
        tried: set[tuple[int, str]] = set()
        try:
            while True:
                self.result, started, held = await self._attempted(tried)
                self.target = as_called(self.target, self._call)
                tried.add(attempt_key(self.target))
                self.call = await self.rt.db(self._ended)
                error = self.result.error
                if not started and error is not None:
                    # Another target at once, when one may serve (§6.11).
                    # A first 5xx is called again below (it may be a blip); once retried, or
                    # with no retry left, the request goes on to another target.
                    switched = await self.rt.db(
                        partial(
                            dropin_target,
                            self.rt.pacer,
                            self.agent,
                            tried,
                            failed=attempt_key(self.target),
                            error=error,
                            retry_first=attempt == 0 and retries > 0,
                        )
                    )
                    if switched is not None and not self._abandoned:
                        held = []
                        self.target, self._call = switched, self._attempt(switched)
                        continue
                again = again_after_ms(
                    result=self.result,
                    started=started,
                    retries_left=retries - attempt,
                    jitter_ms=jitter_ms(retries),
                    fallback_after_ms=settings.AGENTOPS_FALLBACK_AFTER_MS,
                )
                if again is None or self._abandoned:
                    return
                target = self.target
                stated = error is not None and error.retry_after_ms is not None
                waited = await self._waited(again, model=target.model if stated else None)
                if not waited or self._abandoned:  # gone during the journal's check too
                    return
                held = []  # that attempt's answer is not the caller's: another is made
                attempt += 1
                self.target, self._call = target, self._attempt(target)
        finally:
            if not self._abandoned:  # what the answering attempt held back, then the end
                for item in held:
                    self._queue.put_nowait(item)
            self._queue.put_nowait(("end", self.result))

    async def _attempted(
        self, tried: set[tuple[int, str]]
    ) -> tuple[CallResult, bool, list[tuple[str, Any]]]:
        """The current attempt (``_one``), hedged when the agent says so (§6.11): with no
        content after ``hedge_after_ms`` the request also goes to the first free alternate;
        the first of the two to produce content is relayed and becomes the attempt
        (``self._call``, ``self.target``), the other is aborted and its row written."""
        wait_ms = self.agent.hedge_after_ms
        if wait_ms is None or self._hedged or not routed(self.agent):
            return await self._one(self._call)
        race = _Race()
        first = asyncio.ensure_future(self._one(self._call, race))
        claimed = asyncio.ensure_future(race.claimed.wait())
        try:
            await asyncio.wait(
                [first, claimed], timeout=wait_ms / 1000, return_when=asyncio.FIRST_COMPLETED
            )
            if first.done() or race.winner is not None or self._abandoned:
                return await first
            called = attempt_key(as_called(self.target, self._call))
            target = await self.rt.db(dropin_hedge, self.rt.pacer, self.agent, tried | {called})
            if target is None or self._abandoned:
                return await first
            self._hedged = True
            tried.update((called, attempt_key(target)))
            self._hedge = self._attempt(target)
            second = asyncio.ensure_future(self._one(self._hedge, race))
            racing = {first: (self._call, self.target), second: (self._hedge, target)}
            pending: set[asyncio.Future[Any]] = {first, second}
            while race.winner is None and pending:
                _, pending = await asyncio.wait(
                    pending | {claimed}, return_when=asyncio.FIRST_COMPLETED
                )
                pending.discard(claimed)
            if race.winner is not None:
                won = first if race.winner is self._call else second
            else:  # neither produced content: the one that ended last is the answer
                won = max(racing, key=lambda task: _ended_at(racing[task][0]))
            lost = second if won is first else first
            self._call, self.target = racing[won]
            loser = racing[lost][0]
            self._hedge = loser
            loser.abort()
            await asyncio.gather(lost, return_exceptions=True)
            if loser.result is not None:  # recorded and costed like every call
                await self.rt.db(loser.end)
            self._hedge = None
            return await won
        finally:
            claimed.cancel()

    async def _one(
        self, call: ProviderCall, race: _Race | None = None
    ) -> tuple[CallResult, bool, list[tuple[str, Any]]]:
        """One attempt: its result, whether its response started (then all it sent went on to
        the caller as it came) and, when not, what it sent (held back: it may be made again).
        In a ``race``, nothing goes on unless this call produced content first."""
        started = False
        held: list[tuple[str, Any]] = []

        async def on_wire(kind: str, value: Any) -> None:
            nonlocal started
            if not started:
                if kind in ("error_body", "headers"):  # nothing the caller could have read
                    held.append((kind, value))
                    return
                if race is not None and not race.claim(call):
                    return  # the other call of a hedge answered first: this one is dropped
                started = True
                for item in held:
                    await self._put(*item)
                held.clear()
            await self._put(kind, value)

        result = await call.run(
            in_flight=self.streamed,
            on_wire=on_wire,
            pace_max_ms=settings.AGENTOPS_DROPIN_MAX_WAIT_MS,
        )
        return result, started, held

    async def _put(self, kind: str, value: Any) -> None:
        if self._abandoned:
            return
        self._queue.put_nowait((kind, value))
        if self._queue.qsize() >= QUEUE_ITEMS:
            self._room.clear()
            await self._room.wait()

    async def _waited(self, ms: float, *, model: str | None) -> bool:
        """Wait ``ms`` before the next attempt; True when it may be made: the client is still
        there and, after a wait stated for ``model``, the journal holds it no longer (a hold
        some process lengthened meanwhile, to at most the threshold, is slept too)."""
        # A recorded deadline is the stated wait rounded up to the next ms (architecture.md §6.2).
        if await self._slept(ms + (1 if model is not None else 0)):
            return False
        if model is None:
            return True
        for _ in range(WAIT_RECHECKS):
            left = await self.rt.db(self._held_ms, model)
            if left == 0:
                return True
            if left is None or left > settings.AGENTOPS_FALLBACK_AFTER_MS:
                return False
            if await self._slept(left):
                return False
        return False

    async def _slept(self, ms: float) -> bool:
        """Sleep ``ms`` (no database connection held); True when the client went away."""
        assert self._gone is not None
        try:
            async with asyncio.timeout(ms / 1000):
                await self._gone.wait()
        except TimeoutError:
            return False
        return True

    def _held_ms(self, model: str) -> int | None:
        """In a thread: how long the journal still holds ``model`` for the agent (0: it does
        not; None: until released)."""
        now_ms = time.time() * 1000
        hold = admission_check(
            agent=self.agent,
            model=model,
            now_ms=now_ms,
            provider=wait_provider(self.agent, self.target.provider),
        )
        return 0 if hold is None else remaining_ms(hold, now_ms)

    def _ended(self) -> InferenceCall:
        """The row written and the end announced; a stated wait recorded for (agent, model)."""
        row = self._call.end()
        serving_settled(self.agent, row)
        error = self.result.error if self.result is not None else None
        if error is not None and error.retry_after_ms is not None and error.type != "paced":
            limit_record(
                agent=self.agent,
                provider=self._call.provider,
                model=self._call.request.model,
                error=error,
                now_ms=time.time() * 1000,
                own_provider=self._call.provider.pk == self.agent.provider_id,
            )
        return row


def _ended_at(call: ProviderCall) -> float:
    return call.result.timeline.ended or 0.0 if call.result is not None else 0.0


class _Race:
    """A hedged request's two calls: the first to produce content wins (``claim``)."""

    def __init__(self) -> None:
        self.winner: ProviderCall | None = None
        self.claimed = asyncio.Event()

    def claim(self, call: ProviderCall) -> bool:
        if self.winner is None:
            self.winner = call
            self.claimed.set()
        return self.winner is call


def wait_headers(wait_ms: float) -> dict[str, str]:
    """What a 429 of the drop-in endpoints tells the client's SDK of a wait (``wait_ms``: the
    remaining or stated wait; NaN or infinite: until released): ``retry-after`` (whole
    seconds, rounded up) and ``retry-after-ms`` for a finite wait, which the SDKs' backoff
    honours; and ``x-should-retry: false`` past ``AGENTOPS_DROPIN_CLIENT_RETRY_MAX_MS``, which
    both official SDKs obey before they look at the wait, so none sleeps through hours."""
    headers: dict[str, str] = {}
    finite = math.isfinite(wait_ms)
    if finite:
        headers = {
            "retry-after": str(max(0, math.ceil(wait_ms / 1000))),
            "retry-after-ms": str(max(0, math.ceil(wait_ms))),
        }
    if not finite or wait_ms > settings.AGENTOPS_DROPIN_CLIENT_RETRY_MAX_MS:
        headers["x-should-retry"] = "false"
    return headers
