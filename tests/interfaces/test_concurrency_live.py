"""Many auxiliary calls at once on one web process with the default connection pool (10):
no request holds a database connection while it waits on the provider, so none waits for one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentops.models import Agent
from inference.models import InferenceCall, Turn
from tests.agentops.live_asgi import asgi_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]
IN_FLIGHT = 50


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    # A short pool timeout: a request that had to wait for a connection fails fast and visibly.
    yield from asgi_server("concurrency", {"AGENTOPS_DB_POOL_TIMEOUT_MS": "3000"})


async def burst(
    urls_and_bodies: list[tuple[str, dict[str, Any]]], token: str
) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=IN_FLIGHT * 2)
    async with httpx.AsyncClient(
        timeout=60, limits=limits, headers={"authorization": f"Bearer {token}"}
    ) as client:
        return await asyncio.gather(*(client.post(url, json=body) for url, body in urls_and_bodies))


def test_fifty_concurrent_complete_calls_all_succeed(
    server: str, user_token: str, make_agent: Any
) -> None:
    # Each answer takes 1 s, so all fifty are waiting on the provider at once.
    agent: Agent = make_agent(model="answer:delay_ms=1000")
    body = {"messages": [{"participant": "alice", "content": "summarise"}]}
    responses = asyncio.run(
        burst([(f"{server}/api/v1/agents/{agent.name}/complete", body)] * IN_FLIGHT, user_token)
    )
    statuses = [r.status_code for r in responses]
    assert statuses == [200] * IN_FLIGHT, [r.text[:200] for r in responses if r.status_code != 200][
        :3
    ]
    assert all(r.json()["content"] == "Stand-in answer to: alice: summarise" for r in responses)
    assert (
        InferenceCall.objects.filter(agent=agent, kind="auxiliary", outcome="completed").count()
        == IN_FLIGHT
    )


def test_fifty_concurrent_drop_in_calls_all_succeed(
    server: str, user_token: str, make_agent: Any
) -> None:
    agent: Agent = make_agent(model="answer:delay_ms=1000")
    body = {"model": agent.name, "messages": [{"role": "user", "content": "hi"}]}
    responses = asyncio.run(
        burst([(f"{server}/v1/chat/completions", body)] * IN_FLIGHT, user_token)
    )
    assert [r.status_code for r in responses] == [200] * IN_FLIGHT, [
        r.text[:200] for r in responses if r.status_code != 200
    ][:3]
    assert InferenceCall.objects.filter(agent=agent, outcome="completed").count() == IN_FLIGHT


def test_a_hundred_concurrent_turn_submits_all_are_accepted(
    server: str, user_token: str, make_agent: Any
) -> None:
    # A submit is a sync view holding a connection while it runs: a burst larger than the pool
    # waits for its turn at the door, not for a connection past the pool's timeout (a 503
    # that would tell the client the database is down).
    agents = [make_agent() for _ in range(IN_FLIGHT * 2)]
    body = {"messages": [{"participant": "alice", "content": "hi"}]}
    responses = asyncio.run(
        burst([(f"{server}/api/v1/agents/{a.name}/turns", body) for a in agents], user_token)
    )
    assert [r.status_code for r in responses] == [202] * len(agents), [
        r.text[:200] for r in responses if r.status_code != 202
    ][:3]
    assert Turn.objects.filter(agent__in=agents).count() == len(agents)
