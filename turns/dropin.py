"""Drop-in calls (architecture.md §14): a client's own request body, in its provider's wire format, sent
to an agent's provider as an auxiliary call (architecture.md §6.6).

Admission first: a held model is refused without a call (a ``deferred`` row). Then the body
goes out with only ``model`` replaced (and the agent's ``max_tokens`` when the request sets
none), on the request's own event loop, read under the progress bounds like every call; each
event is handed to the caller as it arrives (``DropinCall.arrived``) so it can relay it. When the
call ends its row gets its timeline and usage, and a wait the provider stated is recorded for
(agent, model) and holds the agent's turns too. The agent's history is not touched.

No database connection is held while the provider is waited on: each piece of bookkeeping runs
in the runtime's database threads (``Runtime.db``), which in the web give it back when done.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from django.conf import settings

from agentops.models import Agent
from agentops.runtime import runtime
from calls.client import CallResult
from calls.run import ProviderCall
from calls.types import CompiledRequest
from inference.models import InferenceCall
from turns.auxiliary import Deferred, auxiliary_admit
from waits.services import wait_record

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


def request_max_tokens(kind: str, body: dict[str, Any]) -> int | None:
    for field in (MAX_TOKENS_FIELD[kind], "max_completion_tokens"):
        value = body.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class DropinCall:
    """One drop-in call. ``admit()`` (in a thread), then ``start()`` (on the loop); ``await
    arrived()`` until ``("end", result)``, or ``abort()``: before it come ``("headers", status)``,
    ``("sse", event)``, ``("body", bytes)`` and ``("error_body", (status, headers, bytes))`` as
    the provider sent them. The call reads on as they are taken (QUEUE_ITEMS wait at most).

    A streamed call's row is written before it is sent (the dashboard shows it in flight) and
    completed when it ends; a call that is not streamed has its row written once, when it
    ends, with its outcome."""

    def __init__(self, *, agent: Agent, body: dict[str, Any], headers: dict[str, str]) -> None:
        kind = agent.provider.kind
        self.agent = agent
        self.streamed = body.get("stream") is True
        self.max_tokens = request_max_tokens(kind, body) or agent.max_tokens
        self.body = {**body, "model": agent.model}
        if self.max_tokens and not request_max_tokens(kind, body):
            self.body[MAX_TOKENS_FIELD[kind]] = self.max_tokens
        self.headers = {k: v for k, v in headers.items() if k in FORWARDED_HEADERS}
        self._queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        # Set while the queue has room; the end goes in regardless, so it never waits for a
        # client that is gone.
        self._room = asyncio.Event()
        self._room.set()
        self._abandoned = False  # the client went away: nobody takes from the queue
        self.call: InferenceCall | None = None
        self.result: CallResult | None = None
        # The adapter's URL and headers (the provider's key), with the client's own body.
        request = CompiledRequest(
            model=agent.model,
            system="",
            messages=[],
            max_tokens=self.max_tokens,
            stream=self.streamed,
        )
        self._call = ProviderCall(
            agent, request, InferenceCall.Kind.AUXILIARY, body=self.body, headers=self.headers
        )
        self._task: asyncio.Task[None] | None = None

    def admit(self) -> Deferred | None:
        """None when the call may go out; else the hold (its ``deferred`` row is written).
        Reads the database: call it in a thread."""
        return auxiliary_admit(agent=self.agent, model=self.agent.model, max_tokens=self.max_tokens)

    def start(self) -> None:
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
        """End the call (the client went away): it is recorded as ``aborted``."""
        self._abandoned = True
        self._room.set()
        self._call.abort()

    async def _run(self) -> None:
        call = self._call
        try:

            async def on_wire(kind: str, value: Any) -> None:
                if self._abandoned:
                    return
                self._queue.put_nowait((kind, value))
                if self._queue.qsize() >= QUEUE_ITEMS:
                    self._room.clear()
                    await self._room.wait()

            self.result = await call.run(in_flight=self.streamed, on_wire=on_wire)
            self.call = await runtime().db(self._ended)
        finally:
            self._queue.put_nowait(("end", self.result))

    def _ended(self) -> InferenceCall:
        """The row written and the end announced; a stated wait recorded for (agent, model)."""
        row = self._call.end()
        error = self.result.error if self.result is not None else None
        if error is not None and error.retry_after_ms is not None:
            wait_record(
                agent=self.agent,
                model=self.agent.model,
                retry_after_ms=error.retry_after_ms,
                reason=f"{error.type} (HTTP {error.http_status}): {error.message[:300]}",
                now_ms=time.time() * 1000,
            )
        return row


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
