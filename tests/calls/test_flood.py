"""A provider that streams tiny events as fast as loopback takes them (``tests.hostile``,
``flood-N``), read in this process: the reading leaves the event loop to its other work and
hands the deltas that arrived together over as one (a cancel mid-flood, through a worker, is
in ``tests.agentops.test_flood_live``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from calls.adapters import OpenAIAdapter
from calls.bounds import BoundsSettings
from calls.client import CallResult
from calls.reading import LINES_PER_YIELD, perform_call
from calls.types import CompiledRequest, Message

N = 200_000


async def flood_call(base: str, model: str, **hooks: Any) -> CallResult:
    adapter = OpenAIAdapter()
    request = CompiledRequest(
        model=model,
        system="",
        max_tokens=100,
        stream=True,
        messages=[Message(role="user", blocks=[{"type": "text", "text": "hi"}])],
    )
    wire = adapter.build(base_url=f"{base}/v1", api_key="", request=request)
    return await perform_call(
        adapter=adapter,
        wire=wire,
        streamed=True,
        max_tokens=100,
        bounds=BoundsSettings(),
        **hooks,
    )


async def test_a_flood_of_tiny_deltas_leaves_the_loop_to_its_other_work(
    hostile: str, hostile_requests: Any
) -> None:
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.005)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    texts: list[str] = []

    async def on_delta(text: str) -> None:
        texts.append(text)

    ticking = asyncio.get_running_loop().create_task(ticker())
    result = await flood_call(hostile, f"flood-{N}", on_delta=on_delta)
    ticking.cancel()
    assert result.outcome == "completed" and result.output is not None, result
    assert result.output.text == "x" * N and "".join(texts) == "x" * N
    # Deltas read together reach the hook together (a live event each, else): about one
    # call per LINES_PER_YIELD lines (two lines a delta).
    assert len(texts) < 4 * N / LINES_PER_YIELD, len(texts)
    # Before, the reading held the loop for up to a second at a time.
    assert max(gaps) < 0.15, f"the loop was held for {max(gaps) * 1000:.0f} ms"
    assert hostile_requests() == [{"model": f"flood-{N}", "stream": True}]
