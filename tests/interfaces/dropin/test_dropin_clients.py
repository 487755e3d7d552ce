"""Real clients against the drop-in endpoints (architecture.md §14): the official ``openai`` and
``anthropic`` SDKs at their default settings and an agent framework (openai-agents), pointed
at the service running as a real ASGI server: models listed, usage in streams, structured
output, tool round trips, held models whose 429 no SDK sleeps through, keepalives that keep a
quiet stream's client alive, and a hold committed by a worker binding the web process at once."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from django.test import Client
from pydantic import BaseModel

from agentops.models import Agent
from agentops.tokens import api_token_create
from inference.models import InferenceCall
from tests.agentops.live_asgi import asgi_server
from tests.conftest import wait_for
from tests.turns.test_turns import submit
from waits.clock import clock_ms
from waits.services import wait_record

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

KEEPALIVE_MS = 300
BOUNDS = {
    "progress_bounds": {"before_content_ms": 2000, "between_events_ms": 2000},
    "flat_minimum_ms": 5000,
    "absolute_ms": 8000,
}
USER: Any = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    yield from asgi_server(
        "clients",
        {
            "AGENTOPS_INFERENCE_BOUNDS": json.dumps(BOUNDS),
            "AGENTOPS_DROPIN_KEEPALIVE_MS": str(KEEPALIVE_MS),
        },
    )


@pytest.fixture
def oai(server: str, user_token: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token)  # the SDK's default retries
    yield client
    client.close()


@pytest.fixture
def ant(server: str, user_token: str) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=server, api_key=user_token)  # the SDK's default retries
    yield client
    client.close()


def hold(agent: Agent, ms: float) -> None:
    wait_record(
        agent=agent,
        model=agent.model,
        retry_after_ms=ms,
        reason="rate_limit (HTTP 429): test",
        now_ms=clock_ms(),
    )


# --- models -----------------------------------------------------------------------------


def test_models_list_the_tokens_project_agents_each_sdk_can_call(
    oai: openai.OpenAI, ant: anthropic.Anthropic, make_agent: Any
) -> None:
    chat = make_agent(provider="openai")
    messages = make_agent(provider="anthropic")
    make_agent(
        provider="openai",
        project=api_token_create(name="other", operator=False, project="elsewhere")[0].project,
    )
    assert [m.id for m in oai.models.list()] == [chat.name]
    assert oai.models.retrieve(chat.name).id == chat.name
    assert [m.id for m in ant.models.list()] == [messages.name]
    assert ant.models.retrieve(messages.name).display_name == messages.name
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve(messages.name)  # served by the other format's endpoint


def test_another_projects_agent_is_never_listed_or_found(server: str, make_agent: Any) -> None:
    mine, theirs = (
        api_token_create(name="mine", operator=False, project="p1"),
        api_token_create(name="theirs", operator=False, project="p2"),
    )
    agent = make_agent(project=theirs[0].project)
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=mine[1], max_retries=0)
    assert list(client.models.list()) == []
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(agent.name)
    client.close()


def test_anthropic_model_pages_follow_limit_and_after_id(
    server: str, user_token: str, make_agent: Any
) -> None:
    names = sorted(make_agent(provider="anthropic").name for _ in range(5))
    page = httpx.get(
        f"{server}/v1/models?limit=2",
        headers={"x-api-key": user_token, "anthropic-version": "2023-06-01"},
    ).json()
    assert (
        [m["id"] for m in page["data"]] == names[:2]
        and page["has_more"] is True
        and page["last_id"] == names[1]
    )
    rest = httpx.get(
        f"{server}/v1/models?limit=10&after_id={names[1]}", headers={"x-api-key": user_token}
    ).json()
    assert [m["id"] for m in rest["data"]] == names[2:] and rest["has_more"] is False
    # A cursor is a place in name order, not a lookup (API.md): one that names no agent, as
    # when the last page's last agent was disposed since, goes on from where it would sort.
    gone = names[1] + "~"  # sorts after names[1], before names[2]
    after_gone = httpx.get(
        f"{server}/v1/models?limit=10&after_id={gone}", headers={"x-api-key": user_token}
    )
    assert after_gone.status_code == 200
    assert [m["id"] for m in after_gone.json()["data"]] == names[2:]
    bad = httpx.get(f"{server}/v1/models?limit=0", headers={"x-api-key": user_token})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "limit"
    assert httpx.get(f"{server}/v1/models").status_code == 401


# --- the official SDKs at their defaults ----------------------------------------------------


def test_usage_comes_in_a_stream_that_asks_for_it(oai: openai.OpenAI, make_agent: Any) -> None:
    agent = make_agent(model="answer")
    chunks = list(
        oai.chat.completions.create(
            model=agent.name, messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    call = wait_for(
        lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).first(),
        what="the call's row",
    )
    assert call.output_tokens == chunks[-1].usage.completion_tokens


class City(BaseModel):
    city: str
    population: int


STRUCTURED = (
    "answer:text=" + "%7B%22city%22%3A%22Paris%22%2C%22population%22%3A2100000%7D"
)  # percent-encoded JSON


def test_structured_output_parses(oai: openai.OpenAI, make_agent: Any) -> None:
    agent = make_agent(model=STRUCTURED)
    parsed = (
        oai.chat.completions.parse(model=agent.name, messages=USER, response_format=City)
        .choices[0]
        .message.parsed
    )
    assert parsed == City(city="Paris", population=2_100_000)


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_a_model_held_for_hours_raises_at_once_with_its_wait_and_no_sdk_sleeps(
    oai: openai.OpenAI, ant: anthropic.Anthropic, make_agent: Any, sdk: str
) -> None:
    agent = make_agent(provider=sdk)
    hold(agent, 7_200_000)
    started = time.monotonic()
    if sdk == "openai":
        with pytest.raises(openai.RateLimitError) as raised:
            oai.chat.completions.create(model=agent.name, messages=USER)
    else:
        with pytest.raises(anthropic.RateLimitError) as raised:  # type: ignore[assignment]
            ant.messages.create(model=agent.name, max_tokens=10, messages=USER)
    assert time.monotonic() - started < 2
    headers = raised.value.response.headers
    assert headers["x-should-retry"] == "false" and 7_190 < int(headers["retry-after"]) <= 7_200
    # One request reached the service: the SDK did not retry.
    assert InferenceCall.objects.filter(agent=agent, outcome="deferred").count() == 1


def test_a_short_hold_keeps_the_sdks_own_retry_which_then_gets_the_answer(
    ant: anthropic.Anthropic, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent(provider="anthropic")
    hold(agent, 1500)
    started = time.monotonic()
    message = ant.messages.create(model=agent.name, max_tokens=10, messages=USER)
    assert message.content[0].text == "Stand-in answer to: hi"  # type: ignore[union-attr]
    assert 1.4 < time.monotonic() - started < 10
    assert (
        InferenceCall.objects.filter(agent=agent, outcome="deferred").count() >= 1
        and len(standin_requests()) == 1
    )


@pytest.mark.parametrize(
    "form", ["llm-provider-retry-after", "llm-provider-retry-after-ms", "x-ms-retry-after-ms"]
)
@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_a_providers_long_wait_stated_through_a_gateway_reaches_the_sdk_and_it_does_not_retry(
    oai: openai.OpenAI,
    ant: anthropic.Anthropic,
    make_agent: Any,
    standin_requests: Any,
    sdk: str,
    form: str,
) -> None:
    agent = make_agent(
        provider=sdk,
        model=f"error:status=429,form={form},wait_ms=7200000,type=throttling_error,code=429",
    )
    started = time.monotonic()
    with pytest.raises((openai.RateLimitError, anthropic.RateLimitError)) as raised:
        if sdk == "openai":
            oai.chat.completions.create(model=agent.name, messages=USER)
        else:
            ant.messages.create(model=agent.name, max_tokens=10, messages=USER)
    assert time.monotonic() - started < 2
    raised_error: Any = raised.value
    headers = raised_error.response.headers
    assert headers["x-should-retry"] == "false" and headers["retry-after"] == "7200"
    assert len(standin_requests()) == 1


# --- keepalives to the client ----------------------------------------------------------------


def sse_lines(
    server: str, token: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> list[tuple[float, str]]:
    """Each line of a streamed answer with when it arrived (seconds after the request)."""
    seen: list[tuple[float, str]] = []
    started = time.monotonic()
    with httpx.stream(
        "POST",
        f"{server}{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}", **(headers or {})},
        timeout=30,
    ) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            seen.append((time.monotonic() - started, line))
    return seen


def test_a_provider_slow_to_answer_is_kept_alive_to_the_client_before_its_first_byte(
    server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent(model="answer:delay_ms=1500")  # the provider's headers come after 1.5 s
    lines = sse_lines(
        server,
        user_token,
        "/v1/chat/completions",
        {"model": agent.name, "messages": USER, "stream": True},
    )
    keepalives = [at for at, line in lines if line == ": keepalive"]
    first_data = next(at for at, line in lines if line.startswith("data: "))
    assert len([at for at in keepalives if at < first_data]) >= 3, lines
    assert keepalives[0] < KEEPALIVE_MS / 1000 + 0.3
    assert lines[-2][1] == "data: [DONE]" or lines[-1][1] == "data: [DONE]"


def test_an_anthropic_stream_is_kept_alive_with_ping_events_while_the_model_thinks(
    server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent(provider="anthropic", model="think:silent_ms=1200")
    lines = sse_lines(
        server,
        user_token,
        "/v1/messages",
        {"model": agent.name, "max_tokens": 50, "messages": USER, "stream": True},
        {"anthropic-version": "2023-06-01"},
    )
    assert sum(1 for _, line in lines if line == "event: ping") >= 3, lines
    client = anthropic.Anthropic(base_url=server, api_key=user_token)
    with client.messages.stream(model=agent.name, max_tokens=50, messages=USER) as stream:
        assert stream.get_final_text() == "Stand-in answer to: hi"
    client.close()


def test_keepalives_to_the_client_never_keep_a_silent_provider_from_being_cut(
    oai: openai.OpenAI, server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent(model="silent")
    lines = sse_lines(
        server,
        user_token,
        "/v1/chat/completions",
        {"model": agent.name, "messages": USER, "stream": True},
    )
    assert sum(1 for _, line in lines if line == ": keepalive") >= 4
    cut_at, last = lines[-2] if lines[-1][1] == "" else lines[-1]
    assert '"code": "before_content"' in last and 1.9 < cut_at < 3.5, lines[-3:]
    call = wait_for(
        lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).first(),
        what="the call's row",
    )
    assert call.outcome == "cut" and call.bound == "before_content"


def test_an_error_answer_after_the_stream_started_comes_as_an_error_event(
    server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent(model="error:status=503,delay_ms=900")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0)
    with pytest.raises(openai.APIError) as raised:
        list(client.chat.completions.create(model=agent.name, messages=USER, stream=True))
    client.close()
    assert "server" in str(raised.value.body) or "503" in str(raised.value)


# --- one hold, every process -----------------------------------------------------------------


@pytest.mark.usefixtures("workers")
def test_a_hold_a_worker_committed_binds_the_web_process_at_once(
    api: Client,
    oai: openai.OpenAI,
    server: str,
    user_token: str,
    make_agent: Any,
    standin_requests: Any,
) -> None:
    agent = make_agent(model="error:status=429,form=retry-after,wait_ms=7200000,times=1")
    busy = make_agent(model="answer")
    turn_id = submit(api, agent.name, ("alice", "hi"))["id"]
    # Meanwhile the web process checks admission again and again (another agent's calls), so
    # its view of the journal is always fresh from a moment ago, never due for a poll.
    held = threading.Event()

    def keep_busy() -> None:
        with openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0) as other:
            while not held.is_set():
                other.chat.completions.create(model=busy.name, messages=USER)

    worker = threading.Thread(target=keep_busy, daemon=True)
    worker.start()
    try:
        wait_for(
            lambda: api.get(f"/api/v1/turns/{turn_id}").json()["status"] == "held",
            timeout=10,
            interval=0.002,
            what="the turn held",
        )
        seen_held = time.monotonic()
        with pytest.raises(openai.RateLimitError) as raised:
            oai.chat.completions.create(model=agent.name, messages=USER)
        assert (
            time.monotonic() - seen_held < 0.05 + 0.5
        )  # made within 50 ms; its answer within a moment
    finally:
        held.set()
        worker.join(10)
    assert raised.value.body["provider_admission"] == "deferred"  # type: ignore[index]
    assert [r["model"] for r in standin_requests()].count(agent.model) == 1  # the turn's call only
    api.post(f"/api/v1/turns/{turn_id}/cancel")


# --- an agent framework ----------------------------------------------------------------------


def test_openai_agents_runs_through_a_drop_in_agent_with_a_tool_round_trip(
    server: str, user_token: str, make_agent: Any
) -> None:
    from agents import Agent as FrameworkAgent
    from agents import OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # its traces would go to OpenAI's servers
    agent = make_agent(model="tool:name=lookup")
    looked: list[str] = []

    @function_tool
    def lookup(query: str = "") -> str:
        """Look something up."""
        looked.append(query)
        return "found it"

    async def run() -> str:
        client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key=user_token)
        model = OpenAIChatCompletionsModel(model=agent.name, openai_client=client)
        result = await Runner.run(
            FrameworkAgent(name="t", instructions="be brief", model=model, tools=[lookup]), "hi"
        )
        await client.close()
        return str(result.final_output)

    answer = asyncio.run(run())
    assert len(looked) == 1 and answer == "Tool result received: found it"
    outcomes = list(
        InferenceCall.objects.filter(agent=agent).order_by("id").values_list("outcome", flat=True)
    )
    assert outcomes == ["completed", "completed"]
