"""Token usage on every call (input, output, reasoning, cached input), from each wire format's
usage, streamed and not: on the call row, in the API's call objects and in ``/metrics``."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from django.test import Client

from agentops.models import Agent
from calls.adapters import AnthropicAdapter
from inference.models import InferenceCall
from tests.conftest import scraper
from tests.factories import AgentFactory, CallFactory, ProviderFactory
from tests.turns.test_auxiliary import complete
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True)]

PATHS = {
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "openai-responses": "/v1/responses",
}


def responses_agent(standin: str, **fields: Any) -> Agent:
    provider = ProviderFactory.create(
        name="standin-responses", kind="openai-responses", base_url=f"{standin}/v1"
    )
    agent: Agent = AgentFactory.create(provider=provider, **fields)
    return agent


def reported(kind: str, standin: str, body: dict[str, Any]) -> dict[str, Any]:
    """The usage the stand-in reports for this very request body, asked again unstreamed
    (its counts depend on the messages and the scenario only), read as each format states it."""
    usage = httpx.post(standin + PATHS[kind], json={**body, "stream": False}).json()["usage"]
    if kind == "openai":
        return {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "reasoning_tokens": usage["completion_tokens_details"]["reasoning_tokens"],
            "cached_input_tokens": usage["prompt_tokens_details"]["cached_tokens"],
            "cache_write_tokens": None,
        }
    if kind == "anthropic":
        return {
            "input_tokens": usage["input_tokens"]
            + usage["cache_read_input_tokens"]
            + usage["cache_creation_input_tokens"],
            "output_tokens": usage["output_tokens"],
            "reasoning_tokens": None,
            "cached_input_tokens": usage["cache_read_input_tokens"],
            "cache_write_tokens": usage["cache_creation_input_tokens"],
        }
    return {
        "input_tokens": usage["input_tokens"],
        "output_tokens": usage["output_tokens"],
        "reasoning_tokens": usage["output_tokens_details"]["reasoning_tokens"],
        "cached_input_tokens": usage["input_tokens_details"]["cached_tokens"],
        "cache_write_tokens": None,
    }


@pytest.mark.usefixtures("workers")
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("kind", ["openai", "anthropic", "openai-responses"])
def test_a_turns_call_carries_the_usage_the_provider_reported(
    api: Client, standin: str, standin_requests: Any, make_agent: Any, kind: str, stream: bool
) -> None:
    if kind == "openai-responses":
        agent = responses_agent(standin, model="think", stream=stream)
    else:
        agent = make_agent(provider=kind, model="think", stream=stream)
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello there, how are you?"))["id"])
    assert turn["status"] == "succeeded", turn
    (call,) = turn["calls"]
    (sent,) = standin_requests()
    assert sent["stream"] is stream
    expected = reported(kind, standin, sent["body"])
    assert call["usage"] == expected
    assert expected["input_tokens"] > 0 and expected["output_tokens"] > 0
    if kind != "anthropic":
        assert expected["reasoning_tokens"] > 0  # the think scenario's reasoning, reported apart
    row = InferenceCall.objects.get(pk=call["id"])
    assert (
        row.input_tokens,
        row.output_tokens,
        row.reasoning_tokens,
        row.cached_input_tokens,
        row.cache_write_tokens,
    ) == tuple(expected.values())


def test_an_auxiliary_call_carries_its_usage(
    api: Client, standin: str, standin_requests: Any, make_agent: Any
) -> None:
    agent = make_agent(provider="anthropic")
    response = complete(api, agent.name)
    assert response.status_code == 200, response.content
    (sent,) = standin_requests()
    assert response.json()["call"]["usage"] == reported("anthropic", standin, sent["body"])


def test_a_call_that_reported_no_usage_shows_null_never_zero(
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
    row = InferenceCall.objects.get(agent=agent)
    assert (row.input_tokens, row.output_tokens, row.reasoning_tokens, row.cached_input_tokens) == (
        None,
        None,
        None,
        None,
    )
    from interfaces.selectors import call_out

    assert call_out(row)["usage"] == {
        "input_tokens": None,
        "output_tokens": None,
        "reasoning_tokens": None,
        "cached_input_tokens": None,
        "cache_write_tokens": None,
    }


def test_anthropic_input_counts_cache_reads_and_writes() -> None:
    usage = AnthropicAdapter().usage(
        {
            "input_tokens": 10,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 5,
            "output_tokens": 7,
        }
    )
    assert usage.as_dict() == {
        "input_tokens": 115,
        "output_tokens": 7,
        "reasoning_tokens": None,
        "cached_input_tokens": 100,
        "cache_write_tokens": 5,
    }
    assert AnthropicAdapter().usage({"output_tokens": "x"}).as_dict() == {
        "input_tokens": None,
        "output_tokens": None,
        "reasoning_tokens": None,
        "cached_input_tokens": None,
        "cache_write_tokens": None,
    }


def metric(text: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(
        r"^agentops_tokens_total\{" + re.escape(want) + r"\} (\S+)$", text, re.MULTILINE
    )
    return float(match.group(1)) if match else None


def test_metrics_count_tokens_by_agent_model_kind_and_type(
    api: Client, standin: str, standin_requests: Any, make_agent: Any
) -> None:
    agent = make_agent(provider="openai")
    for _ in range(2):
        assert complete(api, agent.name).status_code == 200
    sent = standin_requests()
    one = reported("openai", standin, sent[0]["body"])
    text = scraper().get("/metrics").content.decode()
    labels = {"agent": agent.name, "model": "answer", "kind": "auxiliary"}
    assert metric(text, **labels, type="input") == 2 * one["input_tokens"]
    assert metric(text, **labels, type="output") == 2 * one["output_tokens"]
    assert metric(text, **labels, type="reasoning") == 0  # reported as 0 by the provider
    assert metric(text, **labels, type="cached_input") == 0
    # A call that reported nothing adds nothing: no series for its model.
    CallFactory.create(agent=agent, kind="auxiliary", model="silent", streamed=False, outcome="cut")
    text = scraper().get("/metrics").content.decode()
    assert metric(text, agent=agent.name, model="silent", kind="auxiliary", type="input") is None
