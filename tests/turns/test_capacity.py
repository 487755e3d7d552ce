"""A provider's limit kept where the provider puts it (architecture.md §6.12, §6.13), against a
provider that serves a real shared quota (``tests.quota``: N requests per window per model,
counted across every agent and process), counting the provider's own 429s. Turns run on the
real worker pool; drop-ins through a real web process with the official SDK."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
from django.test import Client

from agentops.models import Agent, Provider
from tests.agentops.live_asgi import asgi_server
from tests.conftest import poll_until
from tests.factories import AgentFactory
from tests.turns.conftest import Scenario
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True)]


def agents(provider: Provider, count: int, model: str = "shared-model") -> list[Agent]:
    return [AgentFactory.create(provider=provider, model=model) for _ in range(count)]


def refused(requests: list[dict[str, Any]]) -> int:
    return sum(1 for r in requests if r["status"] == 429)


@pytest.mark.usefixtures("workers")
def test_twenty_agents_sharing_a_models_quota_earn_at_most_two_429s(
    api: Client, scenario: Scenario
) -> None:
    provider, requests = scenario(limit=5, window_ms=2000)
    group = agents(provider, 20)
    for _ in range(3):  # three turns each, the twenty at once
        turns = [submit(api, agent.name, ("alice", "hi"))["id"] for agent in group]
        for turn_id in turns:
            assert wait_turn(api, turn_id, timeout=90)["status"] == "succeeded"
    seen = requests()
    assert len([r for r in seen if r["status"] == 200]) == 60
    assert refused(seen) <= 2, Counter(r["status"] for r in seen)


@pytest.mark.usefixtures("workers")
def test_one_agent_told_nothing_is_left_waits_for_the_reset_instead_of_earning_a_429(
    api: Client, scenario: Scenario
) -> None:
    provider, requests = scenario(limit=1, window_ms=1000, dialect="anthropic", kind="anthropic")
    (agent,) = agents(provider, 1)
    for _ in range(10):
        turn_id = submit(api, agent.name, ("alice", "hi"))["id"]
        assert wait_turn(api, turn_id, timeout=30)["status"] == "succeeded"
    seen = requests()
    assert (len(seen), refused(seen)) == (10, 0)
    limits = api.get(f"/api/v1/providers/{provider.name}").json()["limits"]
    assert [(li["model"], li["scope"]) for li in limits] == [("shared-model", "model")]
    assert limits[0]["remaining_requests"] in (0, 1) and limits[0]["resets_at"] is not None
    assert agent.calls.filter(paced_ms__isnull=False).count() >= 8  # waited, not refused


@pytest.mark.usefixtures("workers")
def test_a_spent_credit_holds_every_agent_of_the_account_without_a_call_until_released(
    api: Client, scenario: Scenario, quota: str
) -> None:
    provider, requests = scenario(mode="insufficient_quota")
    first, second = agents(provider, 2, model="model-a")
    third = AgentFactory.create(provider=provider, model="model-b")  # every model of the account
    turn = submit(api, first.name, ("alice", "hi"))["id"]
    held = wait_turn(api, turn, {"held", "failed", "succeeded"}, timeout=30)
    assert held["status"] == "held", held
    others = [submit(api, a.name, ("bob", "hi"))["id"] for a in (second, third)]
    for other in others:
        assert (
            wait_turn(api, other, {"held", "failed", "succeeded"}, timeout=30)["status"] == "held"
        )
    assert len(requests()) == 1  # the other agents called nothing
    listed = api.get("/api/v1/waits").json()["waits"]
    scoped = [w for w in listed if w["provider"] == provider.name]
    assert [(w["agent"], w["model"], w["scope"], w["until"]) for w in scoped] == [
        ("*", "*", "provider", None)
    ]
    limits = api.get(f"/api/v1/providers/{provider.name}").json()["limits"]
    assert [(li["model"], li["held"], li["held_until"]) for li in limits] == [("*", True, None)]
    alerts = api.get("/api/v1/alerts?kind=provider-limit").json()
    assert any(provider.name in a["message"] for a in alerts)
    # The credit is topped up; an operator releases the account: every held turn answers.
    httpx.post(f"{quota}/_quota/config", json={"scenario": provider.name, "limit": 100})
    released = api.post(
        "/api/v1/waits/release",
        data=json.dumps({"provider": provider.name, "reason": "credit topped up"}),
        content_type="application/json",
    )
    assert released.status_code == 200, released.content
    assert [r["scope"] for r in released.json()["receipts"]] == ["provider"]
    for turn_id in (turn, *others):
        assert wait_turn(api, turn_id, timeout=30)["status"] == "succeeded"


@pytest.mark.usefixtures("workers")
def test_fifty_agents_held_by_an_account_hold_resume_no_faster_than_the_stated_rate(
    api: Client, scenario: Scenario
) -> None:
    provider, requests = scenario(limit=10, window_ms=1000)
    group = agents(provider, 50)
    # Learn the provider's rate first, as a running account has.
    warm = submit(api, group[0].name, ("alice", "hi"))["id"]
    assert wait_turn(api, warm, timeout=30)["status"] == "succeeded"
    until = time.time() + 2
    hold = api.post(
        "/api/v1/waits/holds",
        data=json.dumps(
            {
                "provider": provider.name,
                "until": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(until))
                + f".{int(until * 1000) % 1000:03d}Z",
                "reason": "a 2 s account-wide wait",
            }
        ),
        content_type="application/json",
    )
    assert hold.status_code == 201, hold.content
    assert hold.json()["source"] == "operator" and hold.json()["scope"] == "provider"
    turns = [submit(api, agent.name, ("alice", "again"))["id"] for agent in group]
    for turn_id in turns:
        assert wait_turn(api, turn_id, timeout=60)["status"] == "succeeded"
    after = [r for r in requests() if r["at_ms"] >= until * 1000 - 50]
    assert len(after) >= 50
    windows = Counter(r["window"] for r in after)  # the provider's own windows
    assert max(windows.values()) <= 11, windows
    assert refused(after) <= 1


@pytest.fixture(scope="module")
def web(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    yield from asgi_server("capacity", {"AGENTOPS_DROPIN_MAX_WAIT_MS": "10000"})


def test_sixteen_concurrent_dropin_requests_share_the_pacing_without_a_5xx(
    web: str, user_token: str, scenario: Scenario
) -> None:
    provider, requests = scenario(limit=4, window_ms=2000)
    (agent,) = agents(provider, 1)
    client = openai.OpenAI(base_url=f"{web}/v1", api_key=user_token, max_retries=0)

    def one(_: int) -> int:
        try:
            client.chat.completions.create(
                model=agent.name, messages=[{"role": "user", "content": "hi"}]
            )
        except openai.APIStatusError as exc:
            return exc.status_code
        return 200

    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(one, range(16)))
    assert all(s < 500 for s in statuses), statuses
    assert statuses.count(200) >= 14, statuses
    assert refused(requests()) <= 1


def test_a_dropin_past_its_wait_is_answered_by_agentops_with_no_provider_call(
    web: str, user_token: str, scenario: Scenario
) -> None:
    provider, requests = scenario(limit=1, window_ms=60_000)
    (agent,) = agents(provider, 1)
    client = openai.OpenAI(base_url=f"{web}/v1", api_key=user_token, max_retries=0)
    client.chat.completions.create(model=agent.name, messages=[{"role": "user", "content": "a"}])
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(
            model=agent.name, messages=[{"role": "user", "content": "b"}]
        )
    response = caught.value.response
    assert response.headers["x-should-retry"] == "true"
    assert 50 <= int(response.headers["retry-after"]) <= 60  # the provider's reset, not ours
    assert len(requests()) == 1  # the second was never sent
    poll_until(lambda: agent.calls.filter(outcome="deferred").exists(), timeout=5)
    assert agent.calls.filter(outcome="deferred").count() == 1


@pytest.mark.usefixtures("workers")
def test_an_acceleration_limit_pauses_every_agent_of_the_account_for_its_cooldown(
    api: Client, scenario: Scenario
) -> None:
    provider, requests = scenario(mode="acceleration", times=1, retry_after_ms=1500, limit=50)
    first = AgentFactory.create(provider=provider, model="model-a")
    second = AgentFactory.create(provider=provider, model="model-b")
    turn = submit(api, first.name, ("alice", "hi"))["id"]
    assert wait_turn(api, turn, {"held", "failed", "succeeded"}, timeout=30)["status"] == "held"
    listed = [w for w in api.get("/api/v1/waits").json()["waits"] if w["provider"] == provider.name]
    assert [(w["agent"], w["model"], w["scope"]) for w in listed] == [("*", "*", "provider")]
    other = submit(api, second.name, ("bob", "hi"))["id"]
    for turn_id in (turn, other):
        assert wait_turn(api, turn_id, timeout=30)["status"] == "succeeded"
    seen = requests()
    refusal = next(r for r in seen if r["status"] == 429)
    later = [r for r in seen if r["at_ms"] > refusal["at_ms"]]
    # Every model of the account waited the stated 1.5 s at least (plus up to the jitter).
    assert len(later) == 2 and all(r["at_ms"] - refusal["at_ms"] >= 1500 for r in later)
