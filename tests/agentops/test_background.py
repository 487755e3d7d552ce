"""The background loop's HTTP clients (``BackgroundLoop.http_client``): calls fill one client up
to ``CALLS_PER_CLIENT`` before the next is used, so one held stream costs a pool walk over at
most that many, and calls one after another share one client and its idle connections."""

from __future__ import annotations

from contextlib import ExitStack

import httpx

from agentops.background import CALLS_PER_CLIENT, BackgroundLoop


def test_calls_fill_one_client_before_the_next_and_a_finished_call_frees_its_place() -> None:
    engine = BackgroundLoop()

    async def scenario() -> None:
        with ExitStack() as held:
            clients = [held.enter_context(engine.http_client()) for _ in range(2 * CALLS_PER_CLIENT + 1)]
            first, second, third = clients[0], clients[CALLS_PER_CLIENT], clients[-1]
            assert all(isinstance(c, httpx.AsyncClient) for c in clients)
            assert {id(c) for c in clients[:CALLS_PER_CLIENT]} == {id(first)}
            assert {id(c) for c in clients[CALLS_PER_CLIENT:-1]} == {id(second)}
            assert len({id(first), id(second), id(third)}) == 3
        with engine.http_client() as again, engine.http_client() as next_one:
            assert again is first and next_one is first  # calls one after another share one client

    engine.submit(scenario()).result(10)
