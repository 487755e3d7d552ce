"""``POST /agents/{name}/complete`` through the real ASGI app under uvicorn (issue 47, item 11):
a client that goes away before the answer still leaves the call's row (``aborted``), as the
drop-in does. Every provider request has its row."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from inference.models import InferenceCall
from tests.agentops.live_asgi import asgi_server
from tests.conftest import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

TRIES = 3


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    yield from asgi_server("complete")


def test_a_complete_whose_client_goes_away_writes_its_call_row_aborted(
    server: str,
    operator_token: str,
    standin_requests: Callable[[], list[dict[str, Any]]],
    make_agent: Any,
) -> None:
    agent = make_agent(model="hang", max_tokens=None)  # answers nothing; its bound is 3 s
    body = {"messages": [{"participant": "alice", "content": "hi"}]}
    for _ in range(TRIES):
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                f"{server}/api/v1/agents/{agent.name}/complete",
                json=body,
                headers={"authorization": f"Bearer {operator_token}"},
                timeout=httpx.Timeout(10, read=0.8),
            )
    wait_for(lambda: len(standin_requests()) == TRIES, timeout=10, what="the provider requests")
    rows = wait_for(
        lambda: (
            list(InferenceCall.objects.filter(agent=agent, outcome__isnull=False))
            if InferenceCall.objects.filter(agent=agent, outcome__isnull=False).count() >= TRIES
            else None
        ),
        timeout=10,
        what="a row for each provider request",
    )
    assert len(rows) == len(standin_requests()) == TRIES
    for row in rows:
        assert row.outcome == "aborted", (row.outcome, row.error)
        assert row.ended_at is not None and row.sent_at is not None
        assert (row.ended_at - row.sent_at).total_seconds() < 2.5  # ended by the abort
