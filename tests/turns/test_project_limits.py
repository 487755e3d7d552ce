"""Project limits enforced on every call (architecture.md §6.14), against a provider that counts
each request it receives (``tests.quota``, its own quota far out of the way): drop-ins through a
real web process with the official SDK, ``/complete`` over HTTP, turns on real workers."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from django.test import Client

from agentops.models import Agent, Alert, Project
from agentops.tokens import api_token_create
from inference.models import InferenceCall
from tests.agentops.live_asgi import asgi_server
from tests.conftest import WorkerPool, poll_until, worker_pool
from tests.factories import AgentFactory
from tests.turns.conftest import Scenario
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True)]

# Turns' windows: a "minute" of 4 s, and a turn waits at most 1 s before it is held.
TURN_WINDOW_S = 4


@pytest.fixture(scope="module")
def web(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    # A drop-in waits at most 2.5 s for room, then agentops answers 429.
    yield from asgi_server("plimits", {"AGENTOPS_DROPIN_MAX_WAIT_MS": "2500"})


@pytest.fixture(scope="module")
def limit_workers(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(
        1,
        label="pl",
        extra_env={
            "AGENTOPS_PROJECT_LIMIT_WINDOW_S": str(TURN_WINDOW_S),
            "AGENTOPS_FALLBACK_AFTER_MS": "1000",
            "AGENTOPS_RESUME_SPREAD_MS": "200",
        },
    )


def limits_put(api: Client, project: str, **limits: int) -> None:
    answer = api.put(
        f"/api/v1/projects/{project}/limits",
        data=json.dumps(limits),
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content


def project_with_token(name: str) -> tuple[Project, str]:
    token = api_token_create(name=f"{name}-bot", operator=False, project=name)[1]
    return Project.objects.get(name=name), token


def dropin(web: str, token: str, agent: Agent, count: int) -> list[tuple[int, Any]]:
    """``count`` concurrent chat completions: each one's status and headers."""
    client = openai.OpenAI(base_url=f"{web}/v1", api_key=token, max_retries=0)

    def one(i: int) -> tuple[int, Any]:
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=agent.name, messages=[{"role": "user", "content": f"hi {i}"}]
            )
        except openai.APIStatusError as exc:
            return exc.status_code, exc.response.headers
        return raw.http_response.status_code, raw.headers

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def test_concurrent_dropins_over_a_projects_requests_per_minute_get_agentops_429s_and_no_call(
    api: Client,
    web: str,
    scenario: Scenario,
) -> None:
    provider, requests = scenario(limit=1000, window_ms=60_000)
    limited, token = project_with_token("limited")
    other, other_token = project_with_token("other")
    agent = AgentFactory.create(provider=provider, model="m-limited", project=limited)
    neighbour = AgentFactory.create(provider=provider, model="m-other", project=other)
    limits_put(api, "limited", requests_per_minute=5)

    with ThreadPoolExecutor(2) as both:
        mine = both.submit(dropin, web, token, agent, 20)
        theirs = both.submit(dropin, web, other_token, neighbour, 10)
        answers, others = mine.result(), theirs.result()

    statuses = Counter(status for status, _ in answers)
    assert statuses == {200: 5, 429: 15}, statuses
    for status, headers in answers:
        if status == 429:
            assert headers["x-should-retry"] == "true"
            assert headers["x-agentops-limit"] == "project requests_per_minute"
            assert 1 <= int(headers["retry-after"]) <= 60
    # Exactly the limit reached the provider; the other project was never refused.
    seen = Counter(r["model"] for r in requests())
    assert seen == {"m-limited": 5, "m-other": 10}, seen
    assert [s for s, _ in others] == [200] * 10
    poll_until(lambda: agent.calls.filter(outcome="deferred").count() == 15, timeout=5)
    assert not neighbour.calls.exclude(outcome="completed").exists()
    # One alert for the episode, however many calls it refused.
    alerts = Alert.objects.filter(kind="project-limit")
    assert alerts.count() == 1
    assert alerts.get().data["project"] == "limited"


def test_a_complete_over_the_projects_limit_is_answered_429_by_agentops(
    api: Client,
    web: str,
    scenario: Scenario,
) -> None:
    provider, requests = scenario(limit=1000, window_ms=60_000)
    limited, token = project_with_token("limited")
    agent = AgentFactory.create(provider=provider, model="m", project=limited)
    limits_put(api, "limited", requests_per_minute=1)
    body = {"messages": [{"participant": "alice", "content": "hi"}]}
    url = f"{web}/api/v1/agents/{agent.name}/complete"
    auth = {"authorization": f"Bearer {token}"}
    assert httpx.post(url, json=body, headers=auth, timeout=30).status_code == 200
    refused = httpx.post(url, json=body, headers=auth, timeout=30)
    assert refused.status_code == 429, refused.text
    assert refused.headers["x-agentops-limit"] == "project requests_per_minute"
    assert refused.headers["x-should-retry"] == "true"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["data"]["limit"] == "requests_per_minute"
    assert len(requests()) == 1


def test_concurrent_dropins_over_a_projects_calls_at_once_never_exceed_it(
    api: Client,
    web: str,
    scenario: Scenario,
) -> None:
    # Each answer takes 200 ms: 10 requests with 2 at once take 5 rounds, within the 2.5 s a
    # drop-in waits for room, so every one is answered.
    provider, requests = scenario(limit=1000, window_ms=60_000, latency_ms=200)
    limited, token = project_with_token("limited")
    agent = AgentFactory.create(provider=provider, model="m", project=limited)
    limits_put(api, "limited", concurrent_calls=2)
    answers = dropin(web, token, agent, 10)
    assert [s for s, _ in answers] == [200] * 10
    starts = sorted(r["at_ms"] for r in requests())
    # Never more than two in flight: of any three consecutive starts, the third comes after
    # the first of them ended (200 ms later).
    assert all(c - a >= 190 for a, c in zip(starts, starts[2:], strict=False)), starts


def test_turns_of_a_limited_project_are_held_and_all_succeed_after_the_window(
    api: Client,
    limit_workers: WorkerPool,
    scenario: Scenario,
) -> None:
    limit_workers.routed()
    provider, requests = scenario(limit=1000, window_ms=60_000)
    limited, _ = project_with_token("limited")
    group = [AgentFactory.create(provider=provider, model="m", project=limited) for _ in range(5)]
    limits_put(api, "limited", requests_per_minute=2)
    turns = [submit(api, agent.name, ("alice", "hi"))["id"] for agent in group]
    held = [
        t for t in turns if wait_turn(api, t, {"held", "succeeded", "failed"})["status"] == "held"
    ]
    assert len(held) >= 2
    reason = api.get(f"/api/v1/turns/{held[0]}").json()["hold_reason"]
    assert reason.startswith("project limit requests_per_minute"), reason
    for turn_id in turns:
        assert wait_turn(api, turn_id, timeout=60)["status"] == "succeeded"
    starts = sorted(r["at_ms"] for r in requests())
    assert len(starts) == 5
    # Never more than 2 in any window of the limit's length.
    window_ms = TURN_WINDOW_S * 1000
    assert all(c - a >= window_ms - 50 for a, c in zip(starts, starts[2:], strict=False)), starts
    assert InferenceCall.objects.filter(agent__project=limited, outcome="deferred").exists()
    assert not InferenceCall.objects.filter(agent__project=limited, outcome="error").exists()


def test_tokens_per_minute_count_the_estimate_and_give_back_what_was_not_used(
    api: Client,
    web: str,
    scenario: Scenario,
) -> None:
    # Each request is estimated at about 1000 tokens (its max_tokens) and uses 13: with 2500
    # tokens a minute, ten in a row go, as each answer gives back its unused estimate; three
    # at once (answers taking 3 s) do not: the third is refused before the others end.
    provider, requests = scenario(limit=1000, window_ms=60_000)
    limited, token = project_with_token("limited")
    agent = AgentFactory.create(provider=provider, model="m", project=limited, max_tokens=1000)
    limits_put(api, "limited", tokens_per_minute=2500)
    client = openai.OpenAI(base_url=f"{web}/v1", api_key=token, max_retries=0)
    for i in range(10):
        client.chat.completions.create(
            model=agent.name, max_tokens=1000, messages=[{"role": "user", "content": f"hi {i}"}]
        )
    assert len(requests()) == 10
    slow, slow_requests = scenario(limit=1000, window_ms=60_000, latency_ms=3000)
    slow_agent = AgentFactory.create(provider=slow, model="m", project=limited, max_tokens=1000)
    answers = dropin(web, token, slow_agent, 3)
    assert sorted(s for s, _ in answers) == [200, 200, 429], answers
    refused = next(h for s, h in answers if s == 429)
    assert refused["x-agentops-limit"] == "project tokens_per_minute"
    assert len(slow_requests()) == 2


@pytest.fixture(scope="module")
def webs(web: str) -> Iterator[list[str]]:
    """Four web processes: ``web`` and three more."""
    servers = [asgi_server(f"plimits{i}") for i in range(3)]
    bases = [next(server) for server in servers]
    yield [web, *bases]
    for server in servers:
        next(server, None)  # stops it


def test_two_hundred_dropins_from_four_web_processes_get_exactly_fifty_provider_calls(
    api: Client,
    webs: list[str],
    scenario: Scenario,
) -> None:
    provider, requests = scenario(limit=10_000, window_ms=60_000)
    limited, token = project_with_token("limited")
    other, other_token = project_with_token("other")
    agent = AgentFactory.create(provider=provider, model="m-limited", project=limited)
    neighbour = AgentFactory.create(provider=provider, model="m-other", project=other)
    limits_put(api, "limited", requests_per_minute=50)

    async def burst() -> tuple[list[httpx.Response], list[httpx.Response]]:
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:

            def post(i: int, bearer: str, model: str) -> Any:
                return client.post(
                    f"{webs[i % len(webs)]}/v1/chat/completions",
                    headers={"authorization": f"Bearer {bearer}"},
                    json={"model": model, "messages": [{"role": "user", "content": f"hi {i}"}]},
                )

            mine = [post(i, token, agent.name) for i in range(200)]
            theirs = [post(i, other_token, neighbour.name) for i in range(40)]
            answers = await asyncio.gather(*mine, *theirs)
        return list(answers[:200]), list(answers[200:])

    answers, others = asyncio.run(burst())
    statuses = Counter(a.status_code for a in answers)
    assert statuses == {200: 50, 429: 150}, statuses
    for answer in answers:
        if answer.status_code == 429:
            assert answer.headers["x-agentops-limit"] == "project requests_per_minute"
            assert answer.headers["x-should-retry"] == "true"
            assert int(answer.headers["retry-after"]) >= 1
    assert [a.status_code for a in others] == [200] * 40
    seen = Counter(r["model"] for r in requests())
    assert seen == {"m-limited": 50, "m-other": 40}, seen
