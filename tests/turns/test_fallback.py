"""Alternates through a real worker and the stand-in provider (architecture.md §6.11): a held or
failing primary is served from an alternate, sticky until the primary may serve again, and
never for a refusal of the request itself. The stand-in plays each fault by the model's name
and records every request, so each test counts the provider requests per model."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent, Alert
from interfaces.dashboard import dashboard_snapshot
from tests.conftest import WorkerPool, wait_for, worker_pool
from tests.turns.test_turns import submit, wait_turn
from turns.runtime import TurnRuntime

pytestmark = [pytest.mark.django_db(transaction=True)]

RETRY_PRIMARY_MS = 3000
POOL_ENV = {
    "AGENTOPS_FALLBACK_RETRY_PRIMARY_MS": str(RETRY_PRIMARY_MS),
    "AGENTOPS_FALLBACK_AFTER_MS": "30000",
}
ALTERNATE = "answer:text=from-the-alternate"
LONG_429 = "error:status=429,form=retry-after,wait_ms=7200000"


@pytest.fixture(scope="module")
def fallback_pool(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(1, label="fallback", extra_env=POOL_ENV)


@pytest.fixture(autouse=True)
def pool(fallback_pool: WorkerPool) -> WorkerPool:
    return fallback_pool.routed()


def with_alternates(make_agent: Any, model: str, *alternates: str, **fields: Any) -> Agent:
    agent: Agent = make_agent(model=model, **fields)
    agent.fallbacks = [
        {"provider": "standin-openai", "model": m, "context_window": None} for m in alternates
    ]
    agent.save(update_fields=["fallbacks"])
    return agent


def per_model(requests: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["model"] for r in requests)


def test_a_two_hour_wait_is_served_by_the_alternate_in_the_same_run_and_stays_there(
    runtime: TurnRuntime, api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = with_alternates(make_agent, LONG_429, ALTERNATE)
    first = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert first["status"] == "succeeded", first
    assert first["output"]["content"] == "from-the-alternate"
    assert per_model(standin_requests()) == {LONG_429: 1, ALTERNATE: 1}
    routes = [c["route"] for c in first["calls"]]
    assert routes[0] == "primary" and routes[1].startswith("fallback: primary held until 20")
    assert [c["route_kind"] for c in first["calls"]] == ["primary", "fallback"]
    assert first["served_by"] == {"provider": "standin-openai", "model": ALTERNATE}
    serving = api.get(f"/api/v1/agents/{agent.name}").json()["serving"]
    assert serving["model"] == ALTERNATE and serving["primary_held"] is True
    assert serving["primary_until"] is not None
    # The dashboard shows the alternate serving and the primary's wait.
    [shown] = [
        b
        for b in dashboard_snapshot(runtime.pacer, now_ms=time.time() * 1000)["breakers"]
        if b["agent"] == agent.name
    ]
    assert (
        shown["serving"]["model"] == ALTERNATE
        and shown["serving"]["primary_until_ms"] > time.time() * 1000
    )

    # Sticky: the next turn goes to the alternate without a call to the held primary.
    second = wait_turn(api, submit(api, agent.name, ("alice", "again"))["id"])
    assert second["status"] == "succeeded"
    assert per_model(standin_requests()) == {LONG_429: 1, ALTERNATE: 2}
    assert [
        a.kind for a in Alert.objects.filter(agent=agent.name, kind__startswith="fallback")
    ] == ["fallback-engaged"]

    # The operator releases the primary: the next call tries it (it still answers 429, so the
    # wait is recorded again and the same run goes back to the alternate).
    released = api.post(
        "/api/v1/waits/release",
        data=json.dumps({"agent": agent.name, "model": LONG_429, "reason": "provider fixed"}),
        content_type="application/json",
    )
    assert released.status_code == 200, released.content
    third = wait_turn(api, submit(api, agent.name, ("alice", "third"))["id"])
    assert third["status"] == "succeeded"
    assert [c["route"].split(" until")[0] for c in third["calls"]] == [
        "return to primary",
        "fallback: primary held",
    ]
    assert per_model(standin_requests()) == {LONG_429: 2, ALTERNATE: 3}


def test_a_short_wait_is_waited_out_on_the_primary_not_switched(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    primary = "error:status=429,form=retry-after-ms,wait_ms=1500,times=1"
    agent = with_alternates(make_agent, primary, ALTERNATE)
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"], timeout=20)
    assert turn["status"] == "succeeded"
    assert per_model(standin_requests()) == {primary: 2}
    assert turn["served_by"]["model"] == primary


def test_a_primary_down_gets_two_attempts_then_the_alternate_and_is_retried_once_per_interval(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    down = "error:status=503"
    agent = with_alternates(make_agent, down, ALTERNATE)
    first = wait_turn(api, submit(api, agent.name, ("alice", "one"))["id"], timeout=30)
    assert first["status"] == "succeeded"
    assert [c["route"] for c in first["calls"]][:2] == ["primary", "primary"]
    assert first["calls"][2]["route"] == "fallback: primary down (two server failures in a row)"
    assert per_model(standin_requests()) == {down: 2, ALTERNATE: 1}

    # Within the interval: straight to the alternate.
    second = wait_turn(api, submit(api, agent.name, ("alice", "two"))["id"])
    assert [c["model"] for c in second["calls"]] == [ALTERNATE]
    # After it: the primary once (it fails), then the alternate in the same run.
    last_failure = time.time()
    wait_for(lambda: time.time() - last_failure > RETRY_PRIMARY_MS / 1000 + 0.2, timeout=10)
    third = wait_turn(api, submit(api, agent.name, ("alice", "three"))["id"])
    assert third["status"] == "succeeded"
    assert [c["model"] for c in third["calls"]] == [down, ALTERNATE]
    assert per_model(standin_requests()) == {down: 3, ALTERNATE: 3}


def test_an_auth_refusal_goes_to_the_alternate_at_once_with_an_alert_naming_the_provider(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = with_alternates(make_agent, "auth", ALTERNATE)
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert turn["status"] == "succeeded"
    assert per_model(standin_requests()) == {"auth": 1, ALTERNATE: 1}
    alert = Alert.objects.get(agent=agent.name, kind="fallback-engaged")
    assert "standin-openai" in alert.message and "auth failure" in alert.message


@pytest.mark.parametrize(
    "primary", ["refuse", "error:status=400,code=content_filter,message=flagged"]
)
def test_a_refusal_of_the_request_itself_never_goes_to_an_alternate(
    api: Client, make_agent: Any, standin_requests: Any, primary: str
) -> None:
    agent = with_alternates(make_agent, primary, ALTERNATE)
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert turn["status"] == "failed"
    assert per_model(standin_requests()) == {primary: 1}


def test_a_stream_cut_after_content_starts_over_on_the_alternate_without_prefill(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    cut = "error:status=500,form=frame"
    agent = with_alternates(make_agent, cut, ALTERNATE, stream=True)
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert turn["status"] == "succeeded"
    assert turn["output"]["content"] == "from-the-alternate"
    requests = standin_requests()
    assert per_model(requests) == {cut: 1, ALTERNATE: 1}
    # Started over: the alternate got the same conversation, not the partial answer to go on.
    resent = requests[1]["body"]["messages"]
    assert resent == requests[0]["body"]["messages"]
    assert resent[-1]["role"] == "user"


def test_an_alternate_of_another_wire_format_gets_the_history_in_its_own_format(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent(model=LONG_429)
    agent.fallbacks = [
        {"provider": "standin-anthropic", "model": ALTERNATE, "context_window": None}
    ]
    agent.save(update_fields=["fallbacks"])
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert turn["status"] == "succeeded"
    requests = standin_requests()
    assert [r["path"] for r in requests] == ["/v1/chat/completions", "/v1/messages"]
    assert turn["served_by"] == {"provider": "standin-anthropic", "model": ALTERNATE}


def test_fallbacks_are_checked_like_the_agents_own_provider_and_model(
    api: Client, providers: Any
) -> None:
    def create(fallbacks: Any) -> Any:
        body = {"name": "fb-agent", "provider": "standin-openai", "model": "answer"}
        return api.post(
            "/api/v1/agents",
            data=json.dumps({**body, "fallbacks": fallbacks}),
            content_type="application/json",
        )

    unknown = create([{"provider": "nowhere", "model": "m"}])
    assert unknown.status_code == 400 and unknown.json()["data"]["field"] == "fallbacks[0].provider"
    same = create(
        [
            {"provider": "standin-anthropic", "model": "x"},
            {"provider": "standin-anthropic", "model": "x"},
        ]
    )
    assert same.status_code == 400 and same.json()["data"]["field"] == "fallbacks[1].model"
    too_many = create([{"provider": "standin-openai", "model": f"m{i}"} for i in range(5)])
    assert too_many.status_code == 400
    assert not Agent.objects.filter(name="fb-agent").exists()

    made = create(
        [{"provider": "standin-anthropic", "model": "claude-alt", "context_window": 8000}]
    )
    assert made.status_code == 201, made.content
    assert made.json()["fallbacks"] == [
        {"provider": "standin-anthropic", "model": "claude-alt", "context_window": 8000}
    ]
    clash = api.patch(
        "/api/v1/agents/fb-agent",
        data=json.dumps({"fallbacks": [{"provider": "standin-openai", "model": "answer"}]}),
        content_type="application/json",
    )
    assert clash.status_code == 400 and clash.json()["data"]["field"] == "fallbacks[0].model"
    assert Agent.objects.get(name="fb-agent").fallbacks[0]["model"] == "claude-alt"
    cleared = api.patch(
        "/api/v1/agents/fb-agent",
        data=json.dumps({"fallbacks": []}),
        content_type="application/json",
    )
    assert cleared.status_code == 200 and cleared.json()["fallbacks"] == []


def test_complete_goes_to_the_alternate_within_the_request_and_then_directly(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    from tests.turns.test_auxiliary import complete

    agent = with_alternates(make_agent, LONG_429, ALTERNATE)
    first = complete(api, agent.name)
    assert first.status_code == 200, first.content
    assert first.json()["content"] == "from-the-alternate"
    assert per_model(standin_requests()) == {LONG_429: 1, ALTERNATE: 1}
    second = complete(api, agent.name)
    assert second.status_code == 200
    assert per_model(standin_requests()) == {LONG_429: 1, ALTERNATE: 2}
    # A model named by the caller is called as named: no alternate stands in for it.
    named = complete(api, agent.name, model=LONG_429)
    assert named.status_code == 429
    assert per_model(standin_requests()) == {LONG_429: 1, ALTERNATE: 2}


def test_a_wait_binds_the_provider_that_stated_it_not_another_serving_the_same_model(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    # The same model name on two providers: the primary's 429 does not hold the alternate,
    # which is called (and, playing the same scenario, states a wait of its own).
    agent = make_agent(model=LONG_429)
    agent.fallbacks = [{"provider": "standin-anthropic", "model": LONG_429, "context_window": None}]
    agent.save(update_fields=["fallbacks"])
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"], {"held"})
    assert [r["path"] for r in standin_requests()] == ["/v1/chat/completions", "/v1/messages"]
    waits = api.get(f"/api/v1/waits?agent={agent.name}").json()["waits"]
    assert sorted((w["model"], w["provider"] or "") for w in waits) == [
        (LONG_429, ""),
        (LONG_429, "standin-anthropic"),
    ]
    assert turn["status"] == "held"
    # Releasing the model lifts it on both providers.
    released = api.post(
        "/api/v1/waits/release",
        data=json.dumps({"agent": agent.name, "model": LONG_429, "reason": "fixed"}),
        content_type="application/json",
    )
    assert len(released.json()["receipts"]) == 2, released.content


def test_an_ephemeral_run_routes_around_a_long_wait_it_does_not_record(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = with_alternates(make_agent, LONG_429, ALTERNATE, kind=Agent.Kind.EPHEMERAL)
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert turn["status"] == "succeeded", turn
    assert per_model(standin_requests()) == {LONG_429: 1, ALTERNATE: 1}
    assert api.get(f"/api/v1/waits?agent={agent.name}").json()["waits"] == []
