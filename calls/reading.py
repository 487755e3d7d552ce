"""Reading one provider call under the progress bounds (architecture.md §5.2, §5.3, §5.5):
``perform_call`` and the reader it runs.

One task reads the response and applies each parsed event to the call's timeline; a timer on
the event loop is armed for the next deadline and re-armed only when a model event moves it.
Bytes arriving do not move a deadline: only model events do, so keepalives or a trickle cannot
keep a stalled call alive. When the timer fires, the call is cut and its connection closed.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any, Final

import aiohttp
from yarl import URL

from agentops.outbound import (
    ResponseRefused,
    first_byte_hook,
    json_bytes,
    line_batches,
    outbound,
    read_capped,
)
from agentops.providers import secrets_redacted
from agentops.text import untrusted_text
from calls.adapters import Adapter, WireRequest
from calls.bounds import BoundsSettings, CallState, Deadline, describe_cut, next_deadline
from calls.classify import classify_exception, protocol_error
from calls.client import (
    AbortHook,
    CallResult,
    DeltaHook,
    MilestoneHook,
    ProgressHook,
    Timeline,
    WireHook,
    edge_limits,
    now_ms,
)
from calls.limits import Quota, quota_from_headers
from calls.outcome import answer_bounded, item_handled, over_limit
from calls.sse import SseEvent, SseParser
from calls.types import ProviderError

logger = logging.getLogger(__name__)

# Gets what an answer's remaining-quota headers said (None: it had none), once its head
# arrived (architecture.md §6.13). Called on the loop: it must not block.
QuotaHook = Callable[[Quota | None], None]

# A stream whose bytes are always there is read about this many lines at a time, the loop's
# other work (health checks, other calls, timers, a cancel) run between: aiohttp hands over
# what it buffered without a pause, so a fast provider would otherwise hold the loop.
LINES_PER_YIELD: Final = 16


async def perform_call(
    *,
    adapter: Adapter,
    wire: WireRequest,
    streamed: bool,
    max_tokens: int | None,
    bounds: BoundsSettings | None,
    on_delta: DeltaHook | None = None,
    on_abortable: AbortHook | None = None,
    on_milestone: MilestoneHook | None = None,
    on_wire: WireHook | None = None,
    on_progress: ProgressHook | None = None,
    on_quota: QuotaHook | None = None,
) -> CallResult:
    """Make one call and read it under the bounds, on the running loop's session
    (``agentops.outbound``): its connections are kept alive, its TLS trust store loaded once.
    ``on_quota`` gets what the answer's remaining-quota headers say (None: none) as soon as
    its head arrives."""
    reading = _Reading(
        adapter, wire, streamed, max_tokens, bounds, on_delta, on_milestone, on_wire, on_progress
    )
    reading.on_quota = on_quota
    return await reading.run(on_abortable)


class _Reading:
    """One call being read: its timeline, the armed deadline and its timer, the result once it is
    decided. (Methods rather than closures: a worker holds thousands of these at once.)"""

    __slots__ = (
        "__weakref__",
        "adapter",
        "answer_limit",
        "armed",
        "bounds",
        "deadline",
        "deltas",
        "done",
        "loop",
        "max_tokens",
        "on_delta",
        "on_milestone",
        "on_progress",
        "on_quota",
        "on_wire",
        "pumped",
        "quota",
        "reader",
        "streamed",
        "timeline",
        "wire",
    )

    def __init__(
        self,
        adapter: Adapter,
        wire: WireRequest,
        streamed: bool,
        max_tokens: int | None,
        bounds: BoundsSettings | None,
        on_delta: DeltaHook | None,
        on_milestone: MilestoneHook | None,
        on_wire: WireHook | None,
        on_progress: ProgressHook | None,
    ) -> None:
        self.adapter, self.wire, self.streamed, self.max_tokens, self.bounds = (
            adapter,
            wire,
            streamed,
            max_tokens,
            bounds,
        )
        self.on_delta, self.on_milestone, self.on_wire, self.on_progress = (
            on_delta,
            on_milestone,
            on_wire,
            on_progress,
        )
        self.timeline = Timeline(sent=now_ms())
        self.answer_limit = edge_limits().answer
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future[CallResult] = self.loop.create_future()
        self.reader = adapter.reader()
        # The armed deadline's timer and the deadline it is for. It is re-armed only when a
        # model event moves the deadline: a keepalive costs its parse and a counter, nothing more.
        self.armed: asyncio.TimerHandle | None = None
        self.deadline: Deadline | None = None
        self.pumped = (
            False  # the stream's own reading ended the call (not a deadline, not an abort)
        )
        self.quota: Quota | None = None  # the answer's remaining-quota headers
        self.on_quota: QuotaHook | None = None
        # Text deltas not yet handed to ``on_delta`` (None: nobody asked for them).
        self.deltas: list[str] | None = [] if on_delta is not None else None

    async def run(self, on_abortable: AbortHook | None) -> CallResult:
        if on_abortable is not None:
            on_abortable(self.abort)
        if self.on_milestone is not None:
            await self.on_milestone("sent", self.timeline)
        self.arm()
        task = self.loop.create_task(self.pump())
        try:
            result = await self.done
        finally:
            if self.armed is not None:
                self.armed.cancel()
            # A stream that ended the call itself is left to close its response (a second or so
            # at most): cancelled mid-close, the cancellation's traceback kept the call's
            # objects in a cycle for the collector (about 40 per streamed answer).
            if self.pumped and not task.done():
                await asyncio.wait([task], timeout=PUMP_CLOSE_S)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.timeline.ended = now_ms()
        reported = (
            result.output.usage
            if result.output is not None
            else self.reader.output().usage
            if self.streamed
            else {}
        )
        result.usage = self.adapter.usage(reported if isinstance(reported, dict) else {})
        result.quota = self.quota
        return result

    def state(self) -> CallState:
        return self.timeline.state(streamed=self.streamed, max_tokens=self.max_tokens)

    def finish(self, result: CallResult) -> None:
        if not self.done.done():
            self.done.set_result(result)

    def abort(self) -> None:
        self.finish(
            CallResult(
                outcome="aborted",
                timeline=self.timeline,
                error=ProviderError(
                    type="aborted", message="the call was aborted", retryable=False
                ),
            )
        )

    def on_deadline(self, deadline: Deadline) -> None:
        assert self.bounds is not None  # a deadline exists only when bounds are on
        now = now_ms()
        if now < deadline.at:
            # uvloop's timers count whole milliseconds and may fire up to one early: a call is
            # never cut before its deadline.
            self.armed = self.loop.call_at(
                self.loop.time() + max((deadline.at - now) / 1000, 0.001),
                self.on_deadline,
                deadline,
            )
            return
        self.finish(
            CallResult(
                outcome="cut",
                timeline=self.timeline,
                error=ProviderError(
                    type="timeout",
                    message=describe_cut(deadline.bound, self.state(), deadline, self.bounds),
                    retryable=False,
                    bound=deadline.bound.value,
                ),
                bound=deadline.bound,
                bound_deadline=deadline.at,
                lateness_ms=now - deadline.at,
            )
        )

    def arm(self) -> None:
        deadline = next_deadline(self.state(), self.bounds)
        if deadline == self.deadline:
            return
        if self.armed is not None:
            self.armed.cancel()
        self.deadline, self.armed = deadline, None
        if deadline is not None:
            self.armed = self.loop.call_at(
                self.loop.time() + max((deadline.at - now_ms()) / 1000, 0),
                self.on_deadline,
                deadline,
            )

    def header_begun(self) -> None:
        if self.timeline.headers is None and not self.done.done():
            self.timeline.header_begun = now_ms()
            self.arm()

    async def handle(self, item: tuple[Any, ...]) -> bool:
        """Apply one item; True once the call is over."""
        if self.done.done():
            return True
        timeline = self.timeline
        events, had_content = timeline.model_events, timeline.first_content is not None
        result = item_handled(item, self.adapter, self.reader, timeline, self.deltas)
        if result is None and self.reader.answer_size > self.answer_limit:
            # Counted as it arrives: nothing past the limit is read (the connection closes as
            # the pump leaves the response unread), and the stream's end never comes.
            result = over_limit(
                timeline, self.reader.output(), self.reader.answer_size, self.answer_limit
            )
        elif result is not None and not self.streamed:
            result = answer_bounded(result, self.answer_limit)
        if result is not None:
            await self.flush_deltas()
            self.pumped = not self.done.done()
            self.finish(result)
            return True
        if timeline.model_events != events or item[0] == "headers":
            self.arm()
        if self.on_milestone is not None and not had_content and timeline.first_content is not None:
            await self.on_milestone("first_content", timeline)
        if self.on_progress is not None:
            self.on_progress(timeline, self.deadline)
        return False

    async def flush_deltas(self) -> None:
        if self.deltas and self.on_delta is not None and not self.done.done():
            text = "".join(self.deltas)
            self.deltas.clear()
            await self.on_delta(text)

    async def pump(self) -> None:
        wire, on_wire = self.wire, self.on_wire
        edge = outbound()
        limits = edge_limits()
        # A non-streamed call's header section is timed from its first byte (``arm``). The
        # hook holds the reading weakly: the task's context and a pooled connection keep it,
        # and a strong one made a cycle the collector had to find (task, context, reading).
        first_byte_hook.set(None if self.streamed else _header_hook(weakref.ref(self)))
        try:
            async with edge.request(
                wire.url,
                body=json_bytes(wire.body),
                headers=wire.headers,
                addresses=wire.addresses,
                proxied=True,
            ) as resp:
                if await self.handle(("headers",)):
                    return
                status = resp.status
                self.quota = quota_from_headers(resp.headers, self.timeline.headers or now_ms())
                if self.on_quota is not None:
                    self.on_quota(self.quota)
                if on_wire is not None:
                    await on_wire("headers", status)
                if not 200 <= status <= 599:
                    await self.handle(
                        (
                            "error",
                            protocol_error(
                                "bad_status",
                                f"the provider answered with HTTP status {status}, "
                                "which is not a status HTTP has (200-599)",
                            ),
                        )
                    )
                elif 300 <= status < 400:
                    await self.handle(
                        (
                            "error",
                            ProviderError(
                                type="unknown",
                                http_status=status,
                                provider_code="redirect",
                                message=f"the provider answered HTTP {status}, a redirect, "
                                "which is not followed: check the provider's base_url",
                            ),
                        )
                    )
                elif status >= 400:
                    body = _key_free(
                        await read_capped(
                            resp, limits.error_body, what="the error body", setting=None
                        )
                    )
                    headers = {
                        name.lower(): secrets_redacted(untrusted_text(value))
                        for name, value in resp.headers.items()
                    }
                    if on_wire is not None:
                        await on_wire("error_body", (status, headers, body))
                    await self.handle(("error_body", status, headers, body))
                elif self.streamed:
                    parser = SseParser(limits.event)
                    left = LINES_PER_YIELD
                    async for batch in line_batches(
                        resp,
                        line_limit=limits.line,
                        total_limit=limits.stream,
                        most=LINES_PER_YIELD,
                    ):
                        for line in batch:
                            event = parser.feed_line(line)
                            if event is None:
                                continue
                            if self.done.done():
                                return
                            if '"error"' in event.data:
                                # An error frame, maybe: its words are a provider's, to be
                                # relayed and classified without a key. (A substring test:
                                # this runs for every event; an answer's own text is escaped
                                # inside its JSON string, so it never matches.)
                                event = SseEvent(event.event, secrets_redacted(event.data))
                            if on_wire is not None:
                                await on_wire("sse", event)
                            if await self.handle(("sse", event)):
                                return
                        await self.flush_deltas()
                        left -= len(batch)
                        if left <= 0:
                            left = LINES_PER_YIELD
                            await asyncio.sleep(0)
                    await self.handle(("eof",))
                else:
                    data = await read_capped(
                        resp,
                        limits.body,
                        what="the answer",
                        setting="AGENTOPS_PROVIDER_MAX_BODY_BYTES",
                    )
                    if on_wire is not None and not self.done.done():
                        await on_wire("body", data)
                    await self.handle(("body", data))
        except ResponseRefused as exc:
            await self.handle(("error", protocol_error(exc.code, str(exc))))
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            await self.handle(("error", classify_exception(exc, host=URL(wire.url).host)))
        except Exception as exc:  # a bug here must end the call now, not at its deadline
            logger.exception("a call's reading failed unexpectedly")
            await self.handle(("bug", exc))


def _key_free(body: bytes) -> bytes:
    """An error body with every provider key and credential form redacted (``secrets_redacted``),
    before it is classified or relayed; the same bytes when there was none."""
    text = body.decode("utf-8", "replace")
    redacted = secrets_redacted(text)
    return body if redacted is text else redacted.encode()


def _header_hook(reading: weakref.ref[_Reading]) -> Callable[[], None]:
    def begun() -> None:
        alive = reading()
        if alive is not None:
            alive.header_begun()

    return begun


# How long a call that its stream ended waits for the response to close (``_Reading.run``).
PUMP_CLOSE_S: Final = 1.0
