"""The drop-ins absorb transient failures before any byte of the provider's reached the caller
(architecture.md §14.1), through the official SDKs with their own retries off (``max_retries=0``),
against a provider that plays each fault a gateway suite plays and counts the requests it got
(``tests.hostile``'s ``fault:NAME:TIMES``; the stand-in for the Anthropic case). Every provider
request has its call row; content already relayed is never retried, and never ends as a
success when the provider broke off."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from agentops.models import Agent, Provider
from calls.client import CallResult, Timeline
from calls.types import ProviderError
from inference.models import InferenceCall
from tests.agentops.live_asgi import asgi_server
from tests.conftest import BASE_DIR, wait_for
from tests.factories import AgentFactory, ProviderFactory
from tests.interfaces.dropin.test_dropin_clients import sse_lines
from turns.dropin_attempts import JITTER_TOTAL_MS, again_after_ms
from turns.runtime import TurnRuntime
from turns.serving_reads import serving_out
from waits.models import WaitJournalEntry

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

KEEPALIVE_MS = 300
# The first token after 20 s is answered: no first-token deadline shorter than a long prefill.
FIRST_TOKEN_MS = 20_000
BOUNDS = {
    "progress_bounds": {"before_content_ms": 25_000, "between_events_ms": 3000},
    "flat_minimum_ms": 30_000,
    "absolute_ms": 40_000,
}
USER: Any = [{"role": "user", "content": "hi"}]
SIXTY = "".join(f"t{i} " for i in range(60))


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    yield from asgi_server(
        "retries",
        {
            "AGENTOPS_INFERENCE_BOUNDS": json.dumps(BOUNDS),
            "AGENTOPS_DROPIN_KEEPALIVE_MS": str(KEEPALIVE_MS),
        },
    )


@pytest.fixture
def oai(server: str, user_token: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0, timeout=60)
    yield client
    client.close()


@pytest.fixture
def faulty(hostile: str, hostile_requests: Any, db: None) -> Callable[[str], Agent]:
    """An agent whose model is a hostile fault (``NAME:TIMES``), the record of requests cleared."""
    provider = ProviderFactory.create(name="hostile", kind="openai", base_url=f"{hostile}/v1")

    def make(fault: str) -> Agent:
        agent: Agent = AgentFactory.create(provider=provider, model=f"fault:{fault}")
        return agent

    return make


def gap_s(later: InferenceCall, earlier: InferenceCall) -> float:
    """Seconds from one attempt's end to the next one's send."""
    assert later.sent_at is not None and earlier.ended_at is not None
    return (later.sent_at - earlier.ended_at).total_seconds()


def rows(agent: Agent, count: int) -> list[InferenceCall]:
    """The agent's call rows once ``count`` of them are recorded (a streamed call's row is
    completed just after its last event); never more than ``count``."""
    wait_for(
        lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).count() >= count,
        what=f"{count} recorded call rows",
    )
    found = list(InferenceCall.objects.filter(agent=agent).order_by("id"))
    assert len(found) == count, [(r.outcome, r.error) for r in found]
    return found


def streamed_text(client: openai.OpenAI, agent: Agent) -> tuple[str, str | None]:
    text, finish = "", None
    for chunk in client.chat.completions.create(model=agent.name, messages=USER, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    return text, finish


# --- answered in full ---------------------------------------------------------------------


@pytest.mark.parametrize(("fault", "status"), [("429-wait-2:1", 429), ("503-wait-2:1", 503)])
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_a_two_second_stated_wait_is_waited_out_and_the_model_called_again(
    oai: openai.OpenAI, faulty: Any, hostile_requests: Any, streamed: bool, fault: str, status: int
) -> None:
    agent = faulty(fault)
    started = time.monotonic()
    if streamed:
        assert streamed_text(oai, agent) == (SIXTY, "stop")
    else:
        answer = oai.chat.completions.create(model=agent.name, messages=USER)
        assert answer.choices[0].message.content == SIXTY.strip()
    assert time.monotonic() - started >= 2.0
    assert len(hostile_requests()) == 2
    first, second = rows(agent, 2)
    assert first.error is not None
    assert (first.outcome, first.error["http_status"], first.error["retry_after_ms"]) == (
        "error",
        status,
        2000,
    )
    assert second.outcome == "completed"
    assert gap_s(second, first) >= 2.0
    # The wait is recorded as any stated wait is: it held the model for every process.
    assert WaitJournalEntry.objects.filter(agent=agent.name, model=agent.model).count() == 1


def test_a_streaming_caller_gets_keepalives_while_a_stated_wait_is_waited_out(
    server: str, user_token: str, faulty: Any, hostile_requests: Any
) -> None:
    agent = faulty("429-wait-2:1")
    lines = sse_lines(
        server,
        user_token,
        "/v1/chat/completions",
        {"model": agent.name, "messages": USER, "stream": True},
    )
    first_data = next(at for at, line in lines if line.startswith("data: "))
    keepalives = [at for at, line in lines if line == ": keepalive" and at < first_data]
    assert first_data >= 2.0 and len(keepalives) >= 4, lines[:10]
    assert lines[-1][1] == "data: [DONE]" or lines[-2][1] == "data: [DONE]"
    assert len(hostile_requests()) == 2


def test_the_anthropic_sdks_message_stream_survives_a_waited_out_wait(
    server: str, user_token: str, standin_requests: Any, providers: dict[str, Provider]
) -> None:
    # The stream helper, which refuses any event but a ping before message_start, gets the
    # keepalives (pings) of the wait and then the answer of the second call.
    agent = AgentFactory.create(
        provider=providers["anthropic"],
        model="error:status=429,form=retry-after,wait_ms=2000,times=1",
    )
    client = anthropic.Anthropic(base_url=server, api_key=user_token, max_retries=0, timeout=30)
    with client.messages.stream(model=agent.name, max_tokens=50, messages=USER) as stream:
        assert stream.get_final_text() == "Stand-in answer to: hi"
    client.close()
    assert len(standin_requests()) == 2
    assert [r.outcome for r in rows(agent, 2)] == ["error", "completed"]


def test_a_caller_that_goes_away_during_a_wait_gets_no_second_call(
    server: str, user_token: str, faulty: Any, hostile_requests: Any
) -> None:
    gone, twin = faulty("429-wait-2:1:gone"), faulty("429-wait-2:1:twin")
    headers = {"Authorization": f"Bearer {user_token}"}
    with httpx.stream(
        "POST",
        f"{server}/v1/chat/completions",
        json={"model": gone.name, "messages": USER, "stream": True},
        headers=headers,
        timeout=30,
    ) as response:
        assert next(response.iter_lines()) == ": keepalive"  # the wait is being waited out
    # The same request from a caller that stays, sent after the first went away: its 429 states
    # the same wait, so once its second call has answered, the first one's would have gone out.
    stayed = httpx.post(
        f"{server}/v1/chat/completions",
        json={"model": twin.name, "messages": USER},
        headers=headers,
        timeout=30,
    )
    assert stayed.status_code == 200, stayed.text
    asked = [r["model"] for r in hostile_requests()]
    assert (asked.count(twin.model), asked.count(gone.model)) == (2, 1)
    assert [r.outcome for r in rows(gone, 1)] == ["error"]


@pytest.mark.parametrize("fault", ["500:1", "reset:1"])
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_a_5xx_or_a_reset_before_the_response_is_called_again_once_after_a_jitter(
    oai: openai.OpenAI, faulty: Any, hostile_requests: Any, fault: str, streamed: bool
) -> None:
    agent = faulty(fault)
    if streamed:
        assert streamed_text(oai, agent) == (SIXTY, "stop")
    else:
        answer = oai.chat.completions.create(model=agent.name, messages=USER)
        assert answer.choices[0].message.content == SIXTY.strip()
    assert len(hostile_requests()) == 2
    first, second = rows(agent, 2)
    assert first.outcome == "error" and second.outcome == "completed" and first.error is not None
    assert first.error["type"] == ("server" if fault == "500:1" else "network"), first.error
    assert 0.1 <= gap_s(second, first) <= JITTER_TOTAL_MS / 1000 + 0.5


def test_a_first_token_after_20_seconds_is_answered_and_not_called_again(
    oai: openai.OpenAI, faulty: Any, hostile_requests: Any
) -> None:
    agent = faulty(f"first-token-{FIRST_TOKEN_MS}:1")
    started = time.monotonic()
    assert streamed_text(oai, agent) == (SIXTY, "stop")
    assert time.monotonic() - started >= FIRST_TOKEN_MS / 1000
    assert len(hostile_requests()) == 1
    assert [r.outcome for r in rows(agent, 1)] == ["completed"]


@pytest.mark.parametrize("fault", ["malformed:1", "no-done:1"])
def test_a_malformed_chunk_or_a_missing_done_is_answered_in_full(
    oai: openai.OpenAI, faulty: Any, hostile_requests: Any, fault: str
) -> None:
    agent = faulty(fault)
    assert streamed_text(oai, agent) == (SIXTY, "stop")
    assert len(hostile_requests()) == 1
    assert [r.outcome for r in rows(agent, 1)] == ["completed"]


# --- errors, each request with its row ------------------------------------------------------


def test_a_rate_limit_without_a_wait_is_the_callers_at_once(
    oai: openai.OpenAI, faulty: Any, hostile_requests: Any
) -> None:
    agent = faulty("429:all")
    with pytest.raises(openai.RateLimitError):
        oai.chat.completions.create(model=agent.name, messages=USER)
    assert len(hostile_requests()) == 1
    assert [r.outcome for r in rows(agent, 1)] == ["error"]


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_a_503_every_time_is_called_twice_then_the_callers(
    oai: openai.OpenAI, faulty: Any, hostile_requests: Any, streamed: bool
) -> None:
    agent = faulty("503:all")
    if streamed:
        with pytest.raises(openai.APIError) as raised:
            streamed_text(oai, agent)
        assert "server" in str(raised.value.body), raised.value.body
    else:
        with pytest.raises(openai.InternalServerError) as failed:
            oai.chat.completions.create(model=agent.name, messages=USER)
        assert failed.value.status_code == 503
    assert len(hostile_requests()) == 2
    assert [r.outcome for r in rows(agent, 2)] == ["error", "error"]


def test_a_content_filter_refusal_is_not_called_again(
    oai: openai.OpenAI, faulty: Any, hostile_requests: Any
) -> None:
    agent = faulty("content-filter:all")
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model=agent.name, messages=USER, stream=True)
    assert refused.value.code == "content_filter"
    assert len(hostile_requests()) == 1
    assert [r.outcome for r in rows(agent, 1)] == ["error"]


def test_a_wait_longer_than_the_threshold_is_the_callers_429_with_the_wait(
    oai: openai.OpenAI, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent(model="error:status=429,form=retry-after-ms,wait_ms=40000")
    started = time.monotonic()
    with pytest.raises(openai.RateLimitError) as limited:
        oai.chat.completions.create(model=agent.name, messages=USER)
    assert time.monotonic() - started < 5
    assert limited.value.response.headers["retry-after"] == "40"
    assert len(standin_requests()) == 1
    assert [r.outcome for r in rows(agent, 1)] == ["error"]


@pytest.mark.parametrize(("fault", "tokens"), [("cut-40:all", 40), ("stall-20:all", 20)])
def test_content_cut_or_stalled_after_it_reached_the_caller_is_a_clean_error_never_retried(
    oai: openai.OpenAI, faulty: Any, hostile_requests: Any, fault: str, tokens: int
) -> None:
    agent = faulty(fault)
    text, finish = "", None
    with pytest.raises(openai.APIError) as broke:
        for chunk in oai.chat.completions.create(model=agent.name, messages=USER, stream=True):
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
    assert text == "".join(f"t{i} " for i in range(tokens)) and finish is None
    assert broke.value.body is not None
    assert len(hostile_requests()) == 1
    (row,) = rows(agent, 1)
    assert row.outcome == ("cut" if fault.startswith("stall") else "error"), row.error
    if fault.startswith("stall"):
        assert row.bound == "between_events"


@pytest.fixture(scope="module")
def server_without_retries(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    yield from asgi_server(
        "no-retries",
        {"AGENTOPS_INFERENCE_BOUNDS": json.dumps(BOUNDS), "AGENTOPS_DROPIN_RETRIES": "0"},
    )


@pytest.mark.parametrize("fault", ["500:1", "429-wait-2:1"])
def test_no_call_is_made_again_with_retries_set_to_0(
    server_without_retries: str, user_token: str, faulty: Any, hostile_requests: Any, fault: str
) -> None:
    agent = faulty(fault)
    client = openai.OpenAI(
        base_url=f"{server_without_retries}/v1", api_key=user_token, max_retries=0
    )
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(model=agent.name, messages=USER)
    client.close()
    assert failed.value.status_code == (500 if fault == "500:1" else 429)
    assert len(hostile_requests()) == 1
    assert [r.outcome for r in rows(agent, 1)] == ["error"]


# --- the rule, value by value -------------------------------------------------------------


def failed(outcome: str = "error", **error: Any) -> CallResult:
    return CallResult(
        outcome=outcome,
        timeline=Timeline(sent=0, ended=1),
        error=ProviderError(message="x", **{"type": "server", "retryable": True, **error}),
    )


def again(result: CallResult, *, started: bool = False, retries_left: int = 1) -> float | None:
    return again_after_ms(
        result=result,
        started=started,
        retries_left=retries_left,
        jitter_ms=700,
        fallback_after_ms=30_000,
    )


@pytest.mark.parametrize(
    ("wait", "expected"),
    [(29_999, 29_999), (30_000, 30_000), (30_001, None), (math.inf, None), (math.nan, None)],
)
def test_a_stated_wait_up_to_the_threshold_is_waited_and_no_longer(
    wait: float, expected: float | None
) -> None:
    limited = failed(type="rate_limit", http_status=429, retry_after_ms=wait)
    assert again(limited) == expected


def test_what_is_called_again_after_a_jitter_and_what_is_not() -> None:
    assert again(failed(http_status=500)) == 700
    assert again(failed(http_status=503, type="overloaded")) == 700
    assert again(failed(type="network")) == 700
    assert again(failed(type="overloaded", http_status=503, retry_after_ms=1500)) == 1500
    assert again(failed(type="rate_limit", http_status=429)) is None  # no wait stated
    assert again(failed(type="policy", http_status=400, retryable=False)) is None
    assert again(failed(type="timeout", outcome="cut")) is None  # a silent provider
    assert again(failed(http_status=500), started=True) is None
    assert again(failed(http_status=500), retries_left=0) is None
    completed = CallResult(outcome="completed", timeline=Timeline(sent=0, ended=1))
    assert again(completed) is None


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"AGENTOPS_DROPIN_RETRIES": "-1"}, "AGENTOPS_DROPIN_RETRIES must be at least 0"),
        (
            {"AGENTOPS_FALLBACK_AFTER_MS": "soon"},
            "AGENTOPS_FALLBACK_AFTER_MS must be a positive number of milliseconds",
        ),
    ],
)
def test_a_bad_retry_setting_stops_startup_naming_it(env: dict[str, str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "agentops.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and says in done.stderr.splitlines()[-1], done.stderr[-500:]


# --- alternates of the request's own wire format (architecture.md §6.11) ----------------------


@pytest.fixture
def with_alternate(faulty: Any, db: None) -> Callable[..., Agent]:
    """An agent whose model plays a fault, with an alternate on the same provider (``answer``)
    or on another wire format's."""

    def make(fault: str, *, other_format: bool = False) -> Agent:
        agent: Agent = faulty(fault)
        provider = (
            ProviderFactory.create(
                name="elsewhere", kind="anthropic", base_url=agent.provider.base_url
            )
            if other_format
            else agent.provider
        )
        agent.fallbacks = [{"provider": provider.name, "model": "answer", "context_window": None}]
        agent.save(update_fields=["fallbacks"])
        return agent

    return make


@pytest.mark.parametrize(
    ("fault", "primary_calls"), [("429:all", 1), ("503:all", 2), ("reset:all", 2)]
)
def test_a_failing_primary_is_answered_by_the_alternate_within_the_request_and_then_directly(
    oai: openai.OpenAI,
    with_alternate: Any,
    hostile_requests: Any,
    fault: str,
    primary_calls: int,
) -> None:
    agent = with_alternate(fault)
    answer = oai.chat.completions.create(model=agent.name, messages=USER)
    assert answer.choices[0].message.content
    assert [r["model"] for r in hostile_requests()] == [agent.model] * primary_calls + ["answer"]
    recorded = rows(agent, primary_calls + 1)
    assert recorded[-1].route.startswith("fallback: primary down")
    assert [r.outcome for r in recorded] == ["error"] * primary_calls + ["completed"]
    # Sticky: the next request goes to the alternate at once.
    oai.chat.completions.create(model=agent.name, messages=USER)
    assert [r["model"] for r in hostile_requests()][primary_calls + 1 :] == ["answer"]


def test_an_alternate_of_another_wire_format_is_not_used_by_a_drop_in(
    oai: openai.OpenAI, with_alternate: Any, hostile_requests: Any
) -> None:
    agent = with_alternate("429:all", other_format=True)
    with pytest.raises(openai.RateLimitError):
        oai.chat.completions.create(model=agent.name, messages=USER)
    assert [r["model"] for r in hostile_requests()] == [agent.model]


def test_the_alternate_a_turn_would_take_has_no_since_before_it_served(
    runtime: TurnRuntime, oai: openai.OpenAI, with_alternate: Any, hostile_requests: Any
) -> None:
    agent = with_alternate("429:all", other_format=True)
    # A second alternate, of the request's own format: the drop-in goes there.
    agent.fallbacks = [
        *agent.fallbacks,
        {"provider": agent.provider.name, "model": "answer", "context_window": None},
    ]
    agent.save(update_fields=["fallbacks"])
    oai.chat.completions.create(model=agent.name, messages=USER)
    assert [r["model"] for r in hostile_requests()] == [agent.model, "answer"]
    # A turn would go to the first alternate, which has served nothing yet.
    serving = serving_out(runtime.pacer, agent, time.time() * 1000)
    assert serving is not None and serving["provider"] == "elsewhere"
    assert serving["since"] is None


def test_a_refusal_of_the_request_is_not_sent_to_the_alternate(
    oai: openai.OpenAI, with_alternate: Any, hostile_requests: Any
) -> None:
    agent = with_alternate("content-filter:all")
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=agent.name, messages=USER)
    assert [r["model"] for r in hostile_requests()] == [agent.model]


@pytest.mark.timeout(120)
def test_a_primary_silent_after_its_headers_is_cut_and_routed_around_within_the_request(
    oai: openai.OpenAI, with_alternate: Any, hostile_requests: Any
) -> None:
    # 2xx headers at once, then nothing past the before-content bound (25 s here).
    agent = with_alternate("first-token-40000:1")
    stream = oai.chat.completions.create(model=agent.name, messages=USER, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text, "the alternate's answer, in the stream the client opened"
    assert [r["model"] for r in hostile_requests()] == [agent.model, "answer"]
    cut, served = rows(agent, 2)
    assert (cut.outcome, cut.bound) == ("cut", "before_content")
    assert served.outcome == "completed" and served.route.startswith("fallback: primary down")
