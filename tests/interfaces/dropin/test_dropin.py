"""The drop-in endpoints (architecture.md §14) through the official ``openai`` and ``anthropic``
SDKs, pointed at the service running as a real ASGI server (uvicorn, its own process, the pooled
settings) with an agentops token as the SDK's key."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from agentops.models import Agent, Provider
from inference.models import InferenceCall
from tests.agentops.live_asgi import asgi_server
from tests.conftest import wait_for
from tests.factories import AgentFactory, ProviderFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

BOUNDS = {
    "progress_bounds": {"before_content_ms": 600, "between_events_ms": 600},
    "flat_minimum_ms": 3000,
    "absolute_ms": 4000,
}
BEFORE_CONTENT = (
    "no content for 600 ms after the request was sent (before-content bound; "
    "the setting for this bound: AGENTOPS_INFERENCE_BOUNDS.progress_bounds.before_content_ms)"
)
USER: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    yield from asgi_server("dropin", {"AGENTOPS_INFERENCE_BOUNDS": json.dumps(BOUNDS)})


@pytest.fixture
def oai(server: str, user_token: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0, timeout=20)
    yield client
    client.close()


@pytest.fixture
def ant(server: str, user_token: str) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=server, api_key=user_token, max_retries=0, timeout=20)
    yield client
    client.close()


def only_call(agent: Agent) -> InferenceCall:
    """The agent's one call, once recorded (a stream's row is written just after its last event)."""
    call: InferenceCall = wait_for(
        lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).first(),
        what="the call's row",
    )
    assert InferenceCall.objects.filter(agent=agent).count() == 1
    return call


def test_a_non_streamed_chat_completion_goes_to_the_agents_model_as_sent(
    oai: openai.OpenAI, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent(model="answer", max_tokens=77)
    completion = oai.chat.completions.create(model=agent.name, messages=USER, temperature=0.5)
    assert completion.choices[0].message.content == "Stand-in answer to: hi"
    (sent,) = standin_requests()
    # The client's body, with only the model replaced and the agent's max_tokens as the default.
    assert sent["body"] == {
        "model": "answer",
        "messages": USER,
        "temperature": 0.5,
        "max_tokens": 77,
    }
    call = only_call(agent)
    assert call.kind == "auxiliary" and call.outcome == "completed" and not call.streamed
    assert completion.usage is not None
    assert (call.input_tokens, call.output_tokens) == (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
    )
    assert not agent.history.exists()  # the agent's history is not touched


def test_the_requests_max_tokens_wins(
    oai: openai.OpenAI, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent(model="answer", max_tokens=77)
    oai.chat.completions.create(model=agent.name, messages=USER, max_tokens=12)
    assert standin_requests()[0]["body"]["max_tokens"] == 12


def test_a_streamed_chat_completion_relays_every_event_keepalives_included(
    oai: openai.OpenAI, make_agent: Any
) -> None:
    agent = make_agent(model="pings:interval_ms=60,duration_ms=300")
    chunks = list(
        oai.chat.completions.create(
            model=agent.name, messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    keepalives = [c for c in chunks[1:] if c.choices == [] and c.usage is not None]
    assert len(keepalives) >= 3  # the provider's usage-only pings reached the client
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Stand-in answer to: hi"
    call = only_call(agent)
    assert call.streamed and call.outcome == "completed" and call.keepalives >= 3
    assert chunks[-1].usage is not None and call.output_tokens == chunks[-1].usage.completion_tokens


def test_a_tool_call_comes_through(oai: openai.OpenAI, make_agent: Any) -> None:
    agent = make_agent(model="tool")
    tools: Any = [
        {
            "type": "function",
            "function": {"name": "search", "parameters": {"type": "object", "properties": {}}},
        }
    ]
    completion = oai.chat.completions.create(model=agent.name, messages=USER, tools=tools)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    function = call.function  # type: ignore[union-attr]
    assert function.name == "search" and json.loads(function.arguments) == {"query": "hi"}


def test_anthropic_messages_non_streamed_and_streamed(
    ant: anthropic.Anthropic, make_agent: Any
) -> None:
    agent = make_agent(provider="anthropic", model="think")
    message = ant.messages.create(model=agent.name, max_tokens=100, messages=USER)
    assert [b.type for b in message.content] == ["thinking", "text"]
    with ant.messages.stream(model=agent.name, max_tokens=100, messages=USER) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Stand-in answer to: hi" and final.stop_reason == "end_turn"
    wait_for(
        lambda: not InferenceCall.objects.filter(agent=agent, outcome__isnull=True).exists(),
        what="the rows",
    )
    calls = list(InferenceCall.objects.filter(agent=agent).order_by("id"))
    assert [(c.streamed, c.outcome) for c in calls] == [(False, "completed"), (True, "completed")]
    assert (
        calls[1].output_tokens == final.usage.output_tokens
        and calls[1].thinking_started_at is not None
    )


def test_an_anthropic_tool_call(ant: anthropic.Anthropic, make_agent: Any) -> None:
    agent = make_agent(provider="anthropic", model="tool")
    message = ant.messages.create(
        model=agent.name,
        max_tokens=100,
        messages=USER,
        tools=[{"name": "search", "input_schema": {"type": "object"}}],
    )
    assert message.stop_reason == "tool_use"
    (block,) = message.content
    assert block.type == "tool_use" and block.name == "search" and block.input == {"query": "hi"}


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_a_held_model_is_a_rate_limit_error_with_the_remaining_wait_and_no_call(
    oai: openai.OpenAI, ant: anthropic.Anthropic, make_agent: Any, standin_requests: Any, sdk: str
) -> None:
    provider = "openai" if sdk == "openai" else "anthropic"
    agent = make_agent(
        provider=provider, model="error:status=429,form=retry-after-ms,wait_ms=40000"
    )

    def ask() -> Any:
        if sdk == "openai":
            return oai.chat.completions.create(model=agent.name, messages=USER)
        return ant.messages.create(model=agent.name, max_tokens=50, messages=USER)

    rate_limit: Any = openai.RateLimitError if sdk == "openai" else anthropic.RateLimitError
    with pytest.raises(rate_limit) as refused:
        ask()  # the provider's own 429, passed through; its wait (past the threshold) is recorded
    assert refused.value.response.headers["retry-after-ms"] == "40000"
    assert len(standin_requests()) == 1
    with pytest.raises(rate_limit) as deferred:
        ask()
    headers = deferred.value.response.headers
    assert (
        35_000 < int(headers["retry-after-ms"]) <= 40_000
        and 35 <= int(headers["retry-after"]) <= 40
    )
    body = deferred.value.response.json()["error"]
    assert body["provider_admission"] == "deferred" and 35_000 < body["retry_after_ms"] <= 40_000
    # Whole ms, and the instant as every other time of the service is written.
    assert isinstance(body["retry_after_ms"], int) and body["retry_after_ms"] == int(
        headers["retry-after-ms"]
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{3})?Z", body["until"]), body["until"]
    assert len(standin_requests()) == 1  # no provider call
    outcomes = list(
        InferenceCall.objects.filter(agent=agent).order_by("id").values_list("outcome", flat=True)
    )
    assert outcomes == ["error", "deferred"]


def test_a_ping_only_stream_is_cut_before_content_and_the_sdk_raises_naming_the_bound(
    oai: openai.OpenAI, make_agent: Any
) -> None:
    agent = make_agent(model="pings:interval_ms=50")
    started = time.monotonic()
    seen: list[Any] = []
    with pytest.raises(openai.APIError) as cut:
        for chunk in oai.chat.completions.create(model=agent.name, messages=USER, stream=True):
            seen.append(chunk)
    assert cut.value.message == BEFORE_CONTENT
    assert cut.value.body == {
        "message": BEFORE_CONTENT,
        "type": "timeout",
        "param": None,
        "code": "before_content",
    }
    assert len(seen) >= 5  # the pings were relayed until the cut
    assert time.monotonic() - started < 3
    call = wait_for(
        lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).first(),
        what="the call's row",
    )
    assert (
        call.outcome == "cut" and call.bound == "before_content" and call.first_content_at is None
    )


def test_a_cut_anthropic_stream_ends_with_an_error_event(
    ant: anthropic.Anthropic, make_agent: Any
) -> None:
    agent = make_agent(provider="anthropic", model="silent")
    with (
        pytest.raises(anthropic.APIStatusError) as cut,
        ant.messages.stream(model=agent.name, max_tokens=50, messages=USER) as stream,
    ):
        list(stream.text_stream)
    assert BEFORE_CONTENT in str(cut.value)


def test_a_cut_without_a_stream_is_a_504_naming_the_bound_and_its_setting(
    oai: openai.OpenAI, make_agent: Any
) -> None:
    agent = make_agent(model="hang", max_tokens=None)
    with pytest.raises(openai.InternalServerError) as cut:
        oai.chat.completions.create(model=agent.name, messages=USER)
    assert cut.value.status_code == 504
    assert (
        "whole-call bound" in cut.value.message and "AGENTOPS_INFERENCE_BOUNDS" in cut.value.message
    )
    assert cut.value.body["code"] == "whole_call"  # type: ignore[index]


def test_a_provider_error_passes_through_with_its_status(
    oai: openai.OpenAI, ant: anthropic.Anthropic, make_agent: Any
) -> None:
    agent = make_agent(model="refuse")
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model=agent.name, messages=USER)
    assert (
        refused.value.code == "unsupported_parameter"
        and "temperature is not supported" in refused.value.message
    )
    other = make_agent(provider="anthropic", model="overloaded")
    with pytest.raises(anthropic.APIStatusError) as overloaded:
        ant.messages.create(model=other.name, max_tokens=50, messages=USER)
    body: Any = overloaded.value.body
    assert overloaded.value.status_code == 529 and body["error"]["type"] == "overloaded_error"


def test_the_wrong_endpoint_is_a_400_naming_the_right_one(
    oai: openai.OpenAI, ant: anthropic.Anthropic, make_agent: Any
) -> None:
    claude = make_agent(provider="anthropic")
    with pytest.raises(openai.BadRequestError) as wrong:
        oai.chat.completions.create(model=claude.name, messages=USER)
    assert "POST /v1/messages" in wrong.value.message and wrong.value.param == "model"
    gpt = make_agent(provider="openai")
    with pytest.raises(anthropic.BadRequestError) as wrong_way:
        ant.messages.create(model=gpt.name, max_tokens=50, messages=USER)
    assert "POST /v1/chat/completions" in str(wrong_way.value)
    assert not InferenceCall.objects.exists()


def test_an_unknown_or_disposed_agent_is_a_404(
    oai: openai.OpenAI, ant: anthropic.Anthropic, make_agent: Any
) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        oai.chat.completions.create(model="nobody", messages=USER)
    assert "no agent named 'nobody'" in missing.value.message
    from django.utils import timezone

    gone = make_agent(provider="anthropic")
    Agent.objects.filter(pk=gone.pk).update(disposed_at=timezone.now())
    with pytest.raises(anthropic.NotFoundError):
        ant.messages.create(model=gone.name, max_tokens=50, messages=USER)


def test_a_bad_token_is_a_401_in_each_format(server: str, make_agent: Any) -> None:
    agent = make_agent()
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=f"{server}/v1", api_key="ao_wrong", max_retries=0
        ).chat.completions.create(model=agent.name, messages=USER)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server, api_key="ao_wrong", max_retries=0).messages.create(
            model=agent.name, max_tokens=5, messages=USER
        )
    assert not InferenceCall.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{not json", "body"),
        (b"[1]", "body"),
        (b'{"messages": []}', "model"),
        (b'{"model": 3}', "model"),
        (b'{"model": "x", "stream": "yes"}', "stream"),
    ],
)
def test_a_malformed_request_is_a_400_naming_the_field(
    server: str, user_token: str, body: bytes, field: str
) -> None:
    response = httpx.post(
        f"{server}/v1/chat/completions",
        content=body,
        headers={"authorization": f"Bearer {user_token}", "content-type": "application/json"},
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith(f"{field}:") and error["param"] == field


def _nested(model: str, levels: int) -> bytes:
    return b'{"model": "%s", "messages": ' % model.encode() + b"[" * levels + b"]" * levels + b"}"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
@pytest.mark.parametrize(
    ("body", "why"),
    [
        (
            lambda model: _nested(model, 5000),
            "must not nest deeper than 128 levels",
        ),  # past Python's parser
        (
            lambda model: _nested(model, 129),
            "must not nest deeper than 128 levels",
        ),  # one past the limit
        (
            lambda model: (
                b'{"model": "%s", "messages": [{"role": "user", "content": "\\ud800"}]}'
                % model.encode()
            ),
            "must not contain lone surrogates",
        ),
    ],
)
def test_a_body_that_cannot_be_passed_on_is_a_400_before_any_call(
    server: str,
    user_token: str,
    make_agent: Any,
    standin: str,
    path: str,
    body: Callable[[str], bytes],
    why: str,
) -> None:
    """Too deep to parse (Python's parser raised RecursionError: a 500, before the token was
    checked), or text with no UTF-8 encoding (found only when the request was encoded for the
    provider: a 500 here, a 502 with an error call row in a trial by hand): refused at the
    edge, and nothing recorded. The agent exists and serves the endpoint, so nothing else
    stops the body."""
    if path == "/v1/responses":
        agent = AgentFactory.create(
            provider=ProviderFactory.create(
                name="standin-responses", kind="openai-responses", base_url=f"{standin}/v1"
            )
        )
    else:
        agent = make_agent(provider="openai" if path == "/v1/chat/completions" else "anthropic")
    for headers in ({"authorization": f"Bearer {user_token}"}, {}):
        response = httpx.post(
            f"{server}{path}",
            content=body(agent.name),
            headers={**headers, "content-type": "application/json"},
        )
        assert response.status_code == (400 if headers else 401), response.text
        if headers:
            assert f"body: {why}" in response.json()["error"]["message"]
    assert not InferenceCall.objects.exists()


def test_a_body_as_deep_as_the_limit_is_passed_on(
    server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent()
    response = httpx.post(
        f"{server}/v1/chat/completions",
        content=_nested(agent.name, 128),
        headers={"authorization": f"Bearer {user_token}", "content-type": "application/json"},
    )
    assert response.status_code == 200, response.text


def test_another_path_under_v1_is_a_404_in_the_askers_format(
    server: str, oai: openai.OpenAI, ant: anthropic.Anthropic
) -> None:
    """An SDK's other calls (embeddings, counting tokens, say) got Django's HTML page; now the
    SDK reads its own not-found error, which names the endpoints there are."""
    with pytest.raises(openai.NotFoundError) as embedded:
        oai.embeddings.create(model="x", input="hi")
    error = embedded.value.body
    assert (
        isinstance(error, dict)
        and error["type"] == "invalid_request_error"
        and error["code"] == "unknown_url"
    )
    there = (
        "there are POST /v1/chat/completions, POST /v1/messages, POST /v1/responses, GET /v1/models"
    )
    assert error["message"] == f"no drop-in endpoint at /v1/embeddings: {there}"
    with pytest.raises(anthropic.NotFoundError) as counted:
        ant.messages.count_tokens(model="x", messages=[{"role": "user", "content": "hi"}])
    assert counted.value.body == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": f"no drop-in endpoint at /v1/messages/count_tokens: {there}",
        },
    }
    posted = httpx.post(
        f"{server}/v1/completions", json={"model": "x"}
    )  # no token, no CSRF cookie: still the JSON 404
    assert posted.status_code == 404 and posted.json()["error"]["message"].startswith(
        "no drop-in endpoint at /v1/completions"
    )


def test_the_responses_endpoint_serves_responses_agents(
    server: str, user_token: str, standin: str
) -> None:
    provider = ProviderFactory.create(
        name="standin-responses", kind="openai-responses", base_url=f"{standin}/v1"
    )
    agent = AgentFactory.create(provider=provider, model="think")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0, timeout=20)
    response = client.responses.create(model=agent.name, input="hi")
    assert response.output_text == "Stand-in answer to: hi"
    events = [e.type for e in client.responses.create(model=agent.name, input="hi", stream=True)]
    assert events[0] == "response.created" and events[-1] == "response.completed"
    assert "response.reasoning_summary_text.delta" in events


def test_a_client_that_goes_away_ends_the_call(
    server: str, user_token: str, standin: str, make_agent: Any
) -> None:
    agent = make_agent(model="endless:interval_ms=20")
    body = {"model": agent.name, "messages": USER, "stream": True}
    with (
        httpx.Client(timeout=10) as client,
        client.stream(
            "POST",
            f"{server}/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {user_token}"},
        ) as response,
    ):
        assert response.status_code == 200 and response.headers["content-type"].startswith(
            "text/event-stream"
        )
        lines = []
        for line in response.iter_lines():
            lines.append(line)
            if len(lines) >= 10:
                break
    assert any("word0" in line for line in lines)
    call = wait_for(
        lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).first(),
        what="the call's row",
    )
    assert call.outcome == "aborted"
    wait_for(
        lambda: httpx.get(f"{standin}/_standin/open").json() == {"open": 0},
        timeout=5,
        what="the provider stream to close",
    )


def test_a_revoked_token_is_refused_within_the_cache_time(
    server: str, user_token: str, make_agent: Any
) -> None:
    from django.utils import timezone

    from agentops.models import ApiToken

    agent = make_agent()
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0, timeout=20)
    client.chat.completions.create(model=agent.name, messages=USER)
    ApiToken.objects.filter(name="test-user").update(revoked_at=timezone.now())

    def refused() -> bool:
        try:
            client.chat.completions.create(model=agent.name, messages=USER)
        except openai.AuthenticationError:
            return True
        return False

    # The drop-in endpoints keep a token found for 2 s: refused within that (and a little).
    wait_for(refused, timeout=2.1, interval=0.2, what="the revoked token to be refused")


def test_a_client_that_goes_away_before_the_answer_ends_the_call(
    server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent(model="hang", max_tokens=None)  # its whole-call bound is 3 s
    body = {"model": agent.name, "messages": USER}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{server}/v1/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {user_token}"},
            timeout=httpx.Timeout(10, read=0.8),
        )
    call = wait_for(
        lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).first(),
        timeout=10,
        what="the call's row",
    )
    assert call.outcome == "aborted"
    assert (
        call.ended_at is not None
        and call.sent_at is not None
        and (call.ended_at - call.sent_at).total_seconds() < 2.5
    )


def test_another_projects_agent_is_a_404_exactly_like_an_unknown_one(
    oai: openai.OpenAI, make_agent: Any
) -> None:
    from agentops.models import Project

    theirs = make_agent(project=Project.objects.create(name="elsewhere"))
    with pytest.raises(openai.NotFoundError) as hidden:
        oai.chat.completions.create(model=theirs.name, messages=USER)
    with pytest.raises(openai.NotFoundError) as unknown:
        oai.chat.completions.create(model="nobody", messages=USER)
    assert hidden.value.body == json.loads(
        json.dumps(unknown.value.body).replace("nobody", theirs.name)
    )
    assert not InferenceCall.objects.exists()


def test_a_provider_the_policy_refuses_at_call_time_gets_no_request(
    oai: openai.OpenAI, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent()
    Provider.objects.filter(pk=agent.provider_id).update(api_key_env="DATABASE_URL")
    with pytest.raises(openai.APIStatusError) as refused:
        oai.chat.completions.create(model=agent.name, messages=USER)
    assert refused.value.status_code == 502
    assert "provider policy" in refused.value.message and "api_key_env" in refused.value.message
    assert standin_requests() == []
    call = only_call(agent)
    assert call.outcome == "error" and (call.error or {}).get("provider_code") == "provider_refused"
