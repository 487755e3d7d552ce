"""The drop-ins and the model's window (architecture.md §5.9, §14): the client owns its history
there, so nothing is trimmed; an overflow comes back as the provider's 400 in the SDK's shape
with the classified type on the call; a provider's own compaction passes through both ways."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anthropic
import httpx
import openai
import pytest

from agentops.models import HistoryRow
from devtools.standin.playback import (
    ANTHROPIC_COMPACTION,
    ANTHROPIC_CONTEXT_MANAGEMENT,
    RESPONSES_COMPACTION,
)
from inference.models import InferenceCall
from tests.factories import AgentFactory, ProviderFactory
from tests.interfaces.dropin.test_dropin import ant, oai, only_call, server  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

LONG = "word " * 2000  # about 2,500 tokens as the stand-in counts


def test_an_overflow_is_the_providers_400_in_each_sdks_shape_and_nothing_is_trimmed(
    oai: openai.OpenAI,  # noqa: F811
    ant: anthropic.Anthropic,  # noqa: F811
    make_agent: Any,
) -> None:
    agent = make_agent(model="window:tokens=1000", context_window=1000)
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(
            model=agent.name, max_tokens=100, messages=[{"role": "user", "content": LONG}]
        )
    assert refused.value.status_code == 400 and refused.value.code == "context_length_exceeded"
    assert "maximum context length is 1000 tokens" in refused.value.message
    call = only_call(agent)
    assert call.error is not None and call.error["type"] == "context_length"
    assert call.error["context_limit"] == 1000
    other = make_agent(provider="anthropic", model="window:tokens=1000")
    with pytest.raises(anthropic.BadRequestError) as too_long:
        ant.messages.create(
            model=other.name, max_tokens=100, messages=[{"role": "user", "content": LONG}]
        )
    body: Any = too_long.value.body
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["message"].startswith("prompt is too long:")
    assert only_call(other).error["type"] == "context_length"  # type: ignore[index]
    # One call each, no retry, no history and nothing set aside: the client owns its history.
    assert not HistoryRow.objects.exists()
    assert InferenceCall.objects.count() == 2


def post(base: str, token: str, path: str, body: dict[str, Any], **headers: str) -> Any:
    return httpx.post(
        f"{base}{path}",
        content=json.dumps(body),
        headers={"authorization": f"Bearer {token}", "content-type": "application/json", **headers},
        timeout=20,
    )


def test_anthropic_context_management_and_compaction_pass_through_both_ways(
    server: str,  # noqa: F811
    user_token: str,
    make_agent: Any,
    standin_requests: Callable[[], list[dict[str, Any]]],
) -> None:
    agent = make_agent(provider="anthropic", model="compact")
    sent_management = {"edits": [{"type": "compact_20260112", "trigger": {"value": 150000}}]}
    earlier = {"type": "compaction", "content": "Earlier: the user asked for a plan."}
    body = {
        "model": agent.name,
        "max_tokens": 200,
        "context_management": sent_management,
        "messages": [
            {"role": "assistant", "content": [earlier]},
            {"role": "user", "content": "go on"},
        ],
    }
    response = post(server, user_token, "/v1/messages", body, **{"anthropic-version": "2023-06-01"})
    assert response.status_code == 200, response.text
    [received] = standin_requests()
    assert received["body"]["context_management"] == sent_management
    assert received["body"]["messages"] == body["messages"]
    answer = response.json()
    assert answer["content"][0] == ANTHROPIC_COMPACTION
    assert answer["context_management"] == ANTHROPIC_CONTEXT_MANAGEMENT
    # Byte for byte: the stand-in's own serialization of the items is in what the client got.
    compact = json.dumps(ANTHROPIC_COMPACTION, ensure_ascii=False, separators=(",", ":"))
    assert compact in response.text


def test_responses_context_management_and_compaction_items_pass_through_both_ways(
    server: str,  # noqa: F811
    user_token: str,
    standin: str,
    standin_requests: Callable[[], list[dict[str, Any]]],
) -> None:
    provider = ProviderFactory.create(
        name="standin-responses", kind="openai-responses", base_url=f"{standin}/v1"
    )
    agent = AgentFactory.create(provider=provider, model="compact")
    httpx.delete(f"{standin}/_standin/requests")
    sent_management = [{"type": "compaction", "compact_threshold": 200000}]
    body = {
        "model": agent.name,
        "context_management": sent_management,
        "input": [
            dict(RESPONSES_COMPACTION),
            {"role": "user", "content": [{"type": "input_text", "text": "go on"}]},
        ],
    }
    response = post(server, user_token, "/v1/responses", body)
    assert response.status_code == 200, response.text
    [received] = standin_requests()
    assert received["body"]["context_management"] == sent_management
    assert received["body"]["input"] == body["input"]
    assert response.json()["output"][0] == RESPONSES_COMPACTION
    compact = json.dumps(RESPONSES_COMPACTION, ensure_ascii=False, separators=(",", ":"))
    assert compact in response.text
