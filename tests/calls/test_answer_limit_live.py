"""An answer is bounded while it arrives (architecture.md §15): ``AGENTOPS_PROVIDER_MAX_ANSWER_BYTES``
counts a stream's text as it comes, and past it the call reads no further, its connection is
closed, its row says ``answer_too_large`` and the turn does not call again for the same answer;
a streamed drop-in ends with the format's error event, never the stream's own end. The
provider (``tests.hostile``'s ``text-20``) offers 20 MiB against a limit of 1 MiB."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from django.test import Client

from agentops.models import Agent
from inference.models import InferenceCall, Turn
from tests.agentops.live_asgi import SERVER_PIDS, Watch, asgi_server
from tests.conftest import WorkerPool, wait_for, worker_pool
from tests.factories import AgentFactory, ProviderFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

MiB = 1 << 20
LIMIT = {"AGENTOPS_PROVIDER_MAX_ANSWER_BYTES": str(MiB)}
OFFERED = "text-20"  # 20 MiB of text in 512 KiB deltas
# What a process may grow by while it reads the answer: the limit, the delta that crosses it
# and what the reading holds beside them, far under the 20 MiB offered.
GROWTH_BOUND = 16 * MiB


@pytest.fixture(scope="module")
def limit_workers(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(1, label="limit", extra_env=LIMIT)


@pytest.fixture(scope="module")
def web(limit_workers: WorkerPool) -> Iterator[str]:
    yield from asgi_server("limit", {**LIMIT, "AGENTOPS_CELERY_QUEUE": limit_workers.queue})


@pytest.fixture
def flooding(hostile: str, hostile_requests: Any) -> Agent:
    provider = ProviderFactory.create(name="hostile", kind="openai", base_url=f"{hostile}/v1")
    agent: Agent = AgentFactory.create(provider=provider, model=OFFERED, stream=True)
    return agent


def read_off(hostile: str) -> dict[str, Any]:
    """What the provider managed to send of the flood before the client went away."""
    return wait_for(
        lambda: next(
            (f for f in httpx.get(f"{hostile}/_hostile/floods").json() if f["model"] == OFFERED),
            None,
        ),
        what="the flood's record",
    )


def the_call(agent: Agent) -> InferenceCall:
    return wait_for(
        lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).first(),
        what="the call's row",
    )


def test_a_turn_stops_reading_past_the_limit_and_does_not_call_again(
    api: Client, limit_workers: WorkerPool, flooding: Agent, hostile: str, hostile_requests: Any
) -> None:
    limit_workers.routed()
    with Watch([p.pid for p in limit_workers.procs]) as watch:
        submitted = api.post(
            f"/api/v1/agents/{flooding.name}/turns",
            data={"messages": [{"participant": "alice", "content": "hi"}]},
            content_type="application/json",
        )
        turn_id = submitted.json()["id"]
        wait_for(
            lambda: Turn.objects.get(pk=turn_id).status == Turn.Status.FAILED,
            what="the turn to fail",
        )
    assert watch.grown < GROWTH_BOUND, watch.grown
    call = the_call(flooding)
    assert (call.outcome, (call.error or {})["provider_code"]) == ("error", "answer_too_large")
    assert "AGENTOPS_PROVIDER_MAX_ANSWER_BYTES" in (call.error or {})["message"]
    assert len(hostile_requests()) == 1  # terminal for that call: no retry, no re-arm
    assert InferenceCall.objects.filter(agent=flooding).count() == 1
    flood = read_off(hostile)
    assert flood["gone_at"] is not None and flood["done_at"] is None  # the connection closed
    assert flood["sent"] * 512 * 1024 < 10 * MiB, flood  # nothing like the 20 MiB was read


def test_a_streamed_drop_in_ends_with_an_error_event_and_no_done_past_the_limit(
    web: str, user_token: str, flooding: Agent, hostile: str, hostile_requests: Any
) -> None:
    relayed = 0
    tail = b""
    with (
        Watch([SERVER_PIDS[web]], web) as watch,
        httpx.stream(
            "POST",
            f"{web}/v1/chat/completions",
            json={
                "model": flooding.name,
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
            },
            headers={"authorization": f"Bearer {user_token}"},
            timeout=60,
        ) as response,
    ):
        assert response.status_code == 200
        for chunk in response.iter_bytes():
            relayed += len(chunk)
            tail = (tail + chunk)[-4096:]
    assert watch.grown < GROWTH_BOUND, watch.grown
    assert watch.checks and watch.slowest < 0.2 and not watch.failures, watch.slowest
    assert b"[DONE]" not in tail and b"answer_too_large" in tail, tail[-600:]
    assert relayed < 3 * MiB, relayed  # the limit and the delta that crossed it, no more
    call = the_call(flooding)
    assert (call.error or {})["provider_code"] == "answer_too_large"
    assert len(hostile_requests()) == 1
    assert read_off(hostile)["gone_at"] is not None


def test_the_openai_sdk_raises_on_the_error_event_past_the_limit(
    web: str, user_token: str, flooding: Agent
) -> None:
    client = openai.OpenAI(base_url=f"{web}/v1", api_key=user_token, max_retries=0, timeout=60)
    text = ""
    with pytest.raises(openai.APIError, match="AGENTOPS_PROVIDER_MAX_ANSWER_BYTES"):
        for chunk in client.chat.completions.create(
            model=flooding.name, messages=[{"role": "user", "content": "hi"}], stream=True
        ):
            text += "".join(c.delta.content or "" for c in chunk.choices)
    assert MiB <= len(text) < 3 * MiB
    client.close()
