"""Waits and rate limits as gateways and vendors state them (architecture.md §15), form by form,
through a turn on a real worker and through ``POST /agents/{name}/complete``: LiteLLM's proxy passes
a provider's wait on only as ``llm_provider-retry-after(-ms)`` and rewrites the error to
``{"type": "throttling_error", "code": "429"}``; Azure OpenAI states ``x-ms-retry-after-ms``."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client

from agentops.models import HistoryRow
from inference.models import InferenceCall
from tests.turns.test_auxiliary import complete
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True)]

TWO_HOURS_MS = 7_200_000
FORMS = ["llm-provider-retry-after", "llm-provider-retry-after-ms", "x-ms-retry-after-ms"]


@pytest.mark.usefixtures("workers")
@pytest.mark.parametrize("form", FORMS)
def test_a_wait_stated_in_a_gateway_header_holds_the_turn_for_exactly_that_wait(
    api: Client,
    make_agent: Any,
    standin_requests: Any,
    form: str,
) -> None:
    agent = make_agent(
        model=f"error:status=429,form={form},wait_ms={TWO_HOURS_MS},type=throttling_error,code=429"
    )
    turn_id = submit(api, agent.name, ("alice", "hi"))["id"]
    held = wait_turn(api, turn_id, {"held"}, timeout=10)
    until = datetime.fromisoformat(held["held_until"])
    ended = datetime.fromisoformat(held["calls"][0]["ended_at"])
    assert (
        timedelta(hours=2) - timedelta(seconds=5) < until - ended <= timedelta(hours=2, seconds=1)
    )
    assert held["calls"][0]["error"]["type"] == "rate_limit"
    assert len(standin_requests()) == 1  # held, not paced and called again
    api.post(f"/api/v1/turns/{turn_id}/cancel")


@pytest.mark.parametrize("form", FORMS)
def test_complete_records_a_wait_stated_in_a_gateway_header_and_defers_the_next_call(
    api: Client,
    make_agent: Any,
    standin_requests: Any,
    form: str,
) -> None:
    agent = make_agent(
        model=f"error:status=429,form={form},wait_ms={TWO_HOURS_MS},type=throttling_error,code=429"
    )
    refused = complete(api, agent.name)
    assert refused.status_code == 429, refused.content
    data = refused.json()["data"]
    assert (
        data["provider_admission"] == "refused"
        and data["retry_after_ms"] == TWO_HOURS_MS
        and data["recorded"] is True
    )
    deferred = complete(api, agent.name)
    assert (
        deferred.status_code == 429 and deferred.json()["data"]["provider_admission"] == "deferred"
    )
    assert TWO_HOURS_MS - 10_000 < deferred.json()["data"]["retry_after_ms"] <= TWO_HOURS_MS
    assert len(standin_requests()) == 1
    assert list(InferenceCall.objects.filter(agent=agent).values_list("outcome", flat=True)) == [
        "error",
        "deferred",
    ]


@pytest.mark.usefixtures("workers")
def test_a_gateways_rewritten_rate_limit_frame_paces_the_turn_and_it_succeeds_after(
    api: Client,
    make_agent: Any,
    standin_requests: Any,
) -> None:
    # The frame mid-stream, as LiteLLM rewrites a provider's: a rate limit, paced (2 s in these
    # workers) and called again, not a failure of unknown type.
    agent = make_agent(model="error:status=429,form=frame,type=throttling_error,code=429,times=1")
    turn_id = submit(api, agent.name, ("alice", "hi"))["id"]
    turn = wait_turn(api, turn_id, {"succeeded", "failed", "exhausted"}, timeout=20)
    assert turn["status"] == "succeeded", turn
    first, second = turn["calls"]
    assert (
        first["outcome"] == "error"
        and first["error"]["type"] == "rate_limit"
        and first["error"]["retryable"] is True
    )
    assert second["outcome"] == "completed"
    assert len(standin_requests()) == 2
    assert not HistoryRow.objects.filter(agent=agent, role="system-note").exists()


def test_complete_classifies_a_gateways_rewritten_body_as_a_rate_limit(
    api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="error:status=500,type=throttling_error,code=429")
    response = complete(api, agent.name)
    call = InferenceCall.objects.get(agent=agent)
    assert call.error is not None and (call.error["type"], call.error["http_status"]) == (
        "rate_limit",
        500,
    ), call.error
    assert response.status_code == 502 and response.json()["data"]["type"] == "rate_limit", (
        json.loads(response.content)
    )
