"""Auxiliary completions: deferred without a call when the model is held (architecture.md §6.6)."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from django.test import Client

from inference.models import InferenceCall
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True)]


def complete(api: Client, agent: str, **body: Any) -> Any:
    body.setdefault("messages", [{"participant": "alice", "content": "summarise"}])
    return api.post(
        f"/api/v1/agents/{agent}/complete", data=json.dumps(body), content_type="application/json"
    )


def test_an_auxiliary_call_answers(api: Client, make_agent: Any) -> None:
    agent = make_agent()
    response = complete(api, agent.name)
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["content"] == "Stand-in answer to: alice: summarise"
    assert body["call"]["kind"] == "auxiliary" and body["call"]["outcome"] == "completed"


def test_an_unknown_field_is_a_400_naming_it_and_no_call(api: Client, make_agent: Any) -> None:
    agent = make_agent()
    response = complete(api, agent.name, max_token=5)
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == "max_token"
    assert not InferenceCall.objects.exists()


@pytest.mark.usefixtures("workers")
def test_a_held_model_defers_auxiliary_calls_without_a_call_and_another_model_proceeds(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent(model="error:status=429,form=retry-after,wait_ms=600000,times=1")
    turn_id = submit(api, agent.name, ("alice", "hi"))["id"]
    wait_turn(api, turn_id, {"held"}, timeout=10)
    assert len(standin_requests()) == 1
    # Another process's wait binds this one's next check at once (the admission check reads
    # the journal fresh).

    response = complete(api, agent.name)
    assert response.status_code == 429
    body = response.json()
    assert body["code"] == "rate_limit"
    assert body["data"]["provider_admission"] == "deferred" and body["data"]["retryable"] is True
    assert 590_000 < body["data"]["retry_after_ms"] <= 600_000 and isinstance(
        body["data"]["retry_after_ms"], int
    )
    # The instant written as the API writes every instant: as GET /waits shows this wait.
    assert (
        body["data"]["until"]
        == api.get(f"/api/v1/waits?agent={agent.name}").json()["waits"][0]["until"]
    )
    assert len(standin_requests()) == 1  # no provider call
    assert (
        InferenceCall.objects.filter(agent=agent, kind="auxiliary", outcome="deferred").count() == 1
    )

    other = complete(api, agent.name, model="answer")
    assert other.status_code == 200
    assert len(standin_requests()) == 2


@pytest.mark.usefixtures("workers")
def test_a_wait_recorded_by_an_auxiliary_call_holds_the_primary_turn(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent(model="answer")
    refused = complete(api, agent.name, model="error:status=429,form=retry-after-ms,wait_ms=60000")
    assert refused.status_code == 429 and refused.json()["data"]["recorded"] is True
    api.patch(
        f"/api/v1/agents/{agent.name}",
        data=json.dumps({"model": "error:status=429,form=retry-after-ms,wait_ms=60000"}),
        content_type="application/json",
    )
    # Every worker honours a wait recorded elsewhere within 1 s (its journal poll), and nothing
    # outside a worker shows when it last read the journal.
    time.sleep(1.0)
    turn_id = submit(api, agent.name, ("alice", "hi"))["id"]
    held = wait_turn(api, turn_id, {"held"}, timeout=10)
    assert held["calls"] == []  # held before any call
    assert len(standin_requests()) == 1


def test_a_cut_auxiliary_call_is_a_504_naming_its_bound(
    api: Client, make_agent: Any, settings: Any
) -> None:
    from calls.config import bounds_settings

    settings.AGENTOPS_INFERENCE_BOUNDS = json.dumps(
        {
            "progress_bounds": {"before_content_ms": 100, "between_events_ms": 100},
            "flat_minimum_ms": 200,
        }
    )
    bounds_settings.cache_clear()
    try:
        agent = make_agent(model="hang")
        response = complete(api, agent.name)
    finally:
        bounds_settings.cache_clear()
    assert response.status_code == 504
    assert response.json()["code"] == "timeout" and response.json()["data"]["bound"] == "whole_call"
