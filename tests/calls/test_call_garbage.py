"""A worker starts calls by the hundred a second and holds thousands: what a call leaves when it
ends must go with its last reference, not wait for the cyclic collector, whose collections stop
the loop that times the cuts (tens of milliseconds per young collection, hundreds for an older
one, with thousands of streams held), and which in a worker sees what survives a young
collection only at its sweeps (``agentops.collector``). Against the stand-in over sockets, on
the loop's session (``agentops.outbound``, aiohttp)."""

from __future__ import annotations

import gc

import uvloop

from agentops.outbound import outbound_close
from calls.adapters import OpenAIAdapter
from calls.bounds import BoundsSettings
from calls.client import CallResult
from calls.reading import perform_call
from calls.types import CompiledRequest, Message

BOUNDS = BoundsSettings(
    before_content_ms=300,
    between_events_ms=300,
    think_tokens_per_second=100,
    flat_minimum_ms=3000,
    absolute_ms=5000,
)
ANSWERED = [("answer", True), ("answer", False)] * 5
CUT = [("pings:interval_ms=50", True)] * 5


def test_calls_answered_and_cut_leave_nothing_for_the_collector(standin: str) -> None:
    # On the loop the service's calls run on: uvloop (a worker's background loop, the web app
    # under uvicorn). On asyncio's own loop each closed connection's transport stays in a cycle.
    uvloop.run(calls_and_their_garbage(standin))


async def calls_and_their_garbage(standin: str) -> None:
    adapter = OpenAIAdapter()

    async def one(model: str, stream: bool) -> CallResult:
        req = CompiledRequest(
            model=model,
            system="be brief",
            max_tokens=100,
            stream=stream,
            messages=[Message(role="user", blocks=[{"type": "text", "text": "hello"}])],
        )
        wire = adapter.build(base_url=f"{standin}/v1", api_key="", request=req)
        return await perform_call(
            adapter=adapter, wire=wire, streamed=stream, max_tokens=100, bounds=BOUNDS
        )

    async def garbage(calls: list[tuple[str, bool]]) -> tuple[list[str], int]:
        gc.collect()
        gc.disable()
        try:
            outcomes = [(await one(model, stream)).outcome for model, stream in calls]
            return outcomes, gc.collect()
        finally:
            gc.enable()

    await garbage(ANSWERED[:2] + CUT[:1])  # first uses: imports, caches, the pool's connections
    answered, answered_garbage = await garbage(ANSWERED)
    cut, cut_garbage = await garbage(CUT)
    assert answered == ["completed"] * len(ANSWERED) and cut == ["cut"] * len(CUT)
    # On httpx each response stayed in a cycle with its stream (about 60 objects a call, more
    # with a closed connection's), a streamed answer's reading, cancelled while its response
    # closed, in another with the cancellation's traceback. None is left.
    assert answered_garbage < len(ANSWERED), answered_garbage
    assert cut_garbage < len(CUT), cut_garbage
    await outbound_close()
