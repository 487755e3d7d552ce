"""A drop-in call whose client does not keep up (``turns.dropin.DropinCall``), against a
provider that floods (``tests.hostile``, ``flood-N``): what waits for the client is bounded,
the provider is held back, and the call ends as aborted when the client goes away."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from channels.db import database_sync_to_async

from agentops.models import Agent
from inference.models import InferenceCall
from tests.factories import AgentFactory, ProviderFactory
from turns.dropin import QUEUE_ITEMS, DropinCall
from turns.runtime import TurnRuntime

pytestmark = [pytest.mark.django_db(transaction=True)]

N = 1_000_000


def flood_agent(hostile: str) -> Agent:
    provider = ProviderFactory.create(name="hostile", kind="openai", base_url=f"{hostile}/v1")
    agent: Agent = AgentFactory.create(provider=provider, model=f"flood-{N}")
    return agent


async def test_a_client_that_stops_taking_leaves_at_most_the_bound_waiting(
    runtime: TurnRuntime, hostile: str, hostile_requests: Any
) -> None:
    agent = await database_sync_to_async(flood_agent)(hostile)
    body = {"model": agent.name, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    call = DropinCall(runtime, agent=agent, body=body, headers={})
    assert await database_sync_to_async(call.admit)() is None
    call.start()
    taken = await call.arrived()
    while not any(kind == "sse" for kind, _ in taken):
        taken = await call.arrived()

    async def sent() -> int:
        async with httpx.AsyncClient() as client:
            floods = (await client.get(f"{hostile}/_hostile/floods")).json()
        return int(floods[0]["sent"])

    # The client takes nothing for a while: the provider is held back over TCP once the
    # sockets' buffers are full, and no more than the bound waits in the process.
    before = -1
    while (now := await sent()) != before:
        before = now
        await asyncio.sleep(1.0)
    waiting = await call.arrived()
    assert len(waiting) <= QUEUE_ITEMS + 1, len(waiting)
    assert now < N
    call.abort()  # the client went away
    while call.result is None or call.call is None:
        await asyncio.sleep(0.05)
    assert call.result.outcome == "aborted"
    row = await database_sync_to_async(InferenceCall.objects.get)(agent=agent)
    assert row.outcome == "aborted"
    assert hostile_requests() == [{"model": f"flood-{N}", "stream": True}]
