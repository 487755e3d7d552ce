"""Failover through a drop-in as a third-party gateway suite drives it (failoverbench's shape:
the openai SDK with its retries off, real providers on loopback; architecture.md §6.11): an
overflow goes to an alternate whose window is larger than the one the refusal stated, and a
first token that takes 20 s is raced by the alternate after the agent's ``hedge_after_ms``."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from agentops.models import Agent
from inference.models import InferenceCall
from tests.agentops.live_asgi import asgi_server
from tests.conftest import wait_for
from tests.factories import AgentFactory, ProviderFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

OVERFLOWING = "window:tokens=8192,density=8"
# About 1,250 tokens as we count them, 10,000 as the primary does (eight times denser): over
# its 8,192-token window, while our estimate (plus the answer's reserve) is far inside it.
LONG = "word " * 1000
WIDE = "answer:text=from-the-wide-alternate"
NARROW = "answer:text=from-the-narrow-alternate"


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    yield from asgi_server("failover", {"AGENTOPS_FALLBACK_RETRY_PRIMARY_MS": "30000"})


@pytest.fixture
def oai(server: str, user_token: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0, timeout=30)
    yield client
    client.close()


def test_an_overflow_goes_to_the_alternate_whose_window_is_larger_than_the_one_stated(
    oai: openai.OpenAI, make_agent: Any, standin_requests: Any
) -> None:
    agent: Agent = make_agent(model=OVERFLOWING, max_tokens=256)
    # The first alternate's window is under the stated 8,192: it would be refused the same.
    agent.fallbacks = [
        {"provider": "standin-openai", "model": NARROW, "context_window": 8000},
        {"provider": "standin-openai", "model": WIDE, "context_window": 32000},
    ]
    agent.save(update_fields=["fallbacks"])
    started = time.monotonic()
    answer = oai.chat.completions.create(
        model=agent.name, messages=[{"role": "user", "content": LONG}]
    )
    assert time.monotonic() - started < 12
    assert answer.choices[0].message.content == "from-the-wide-alternate"
    assert Counter(r["model"] for r in standin_requests()) == {OVERFLOWING: 1, WIDE: 1}
    calls = list(InferenceCall.objects.filter(agent=agent).order_by("id"))
    assert [c.model for c in calls] == [OVERFLOWING, WIDE]
    assert calls[0].error is not None and calls[0].error["context_limit"] == 8192
    assert "over its window" in calls[1].route

    # Streamed too: the refusal came before anything was relayed.
    chunks = oai.chat.completions.create(
        model=agent.name, messages=[{"role": "user", "content": LONG}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "from-the-wide-alternate"


def test_an_overflow_with_no_alternate_large_enough_is_the_providers_refusal(
    oai: openai.OpenAI, make_agent: Any, standin_requests: Any
) -> None:
    agent: Agent = make_agent(model=OVERFLOWING, max_tokens=256)
    agent.fallbacks = [{"provider": "standin-openai", "model": NARROW, "context_window": 8192}]
    agent.save(update_fields=["fallbacks"])
    with pytest.raises(openai.BadRequestError) as refused:
        oai.chat.completions.create(model=agent.name, messages=[{"role": "user", "content": LONG}])
    assert refused.value.code == "context_length_exceeded"
    assert Counter(r["model"] for r in standin_requests()) == {OVERFLOWING: 1}


def test_a_first_token_after_20_s_is_answered_by_the_alternate_after_hedge_after_ms(
    oai: openai.OpenAI, hostile: str, hostile_requests: Any
) -> None:
    provider = ProviderFactory.create(name="hostile", kind="openai", base_url=f"{hostile}/v1")
    slow = "fault:first-token-20000:all"
    agent: Agent = AgentFactory.create(
        provider=provider,
        model=slow,
        hedge_after_ms=10_000,
        fallbacks=[{"provider": "hostile", "model": "answer", "context_window": None}],
    )
    started = time.monotonic()
    chunks = oai.chat.completions.create(
        model=agent.name, messages=[{"role": "user", "content": LONG}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    took = time.monotonic() - started
    assert text == "Hello there"  # the alternate's answer, relayed alone
    assert 10 <= took < 12, took
    # Both recorded (and costed): the primary's cancelled once the alternate answered.
    calls = wait_for(
        lambda: (
            rows
            if len(rows := list(InferenceCall.objects.filter(agent=agent).order_by("id"))) == 2
            and all(r.outcome for r in rows)
            else None
        ),
        what="both calls' rows",
    )
    assert [(c.model, c.outcome) for c in calls] == [(slow, "aborted"), ("answer", "completed")]
    assert calls[1].route.startswith("hedge: no content from the first call after 10000 ms")
    assert [r["model"] for r in hostile_requests()] == [slow, "answer"]


def test_without_hedge_after_ms_the_slow_first_token_is_waited_for(
    oai: openai.OpenAI, hostile: str, hostile_requests: Any
) -> None:
    provider = ProviderFactory.create(name="hostile", kind="openai", base_url=f"{hostile}/v1")
    slow = "fault:first-token-1500:all"
    agent: Agent = AgentFactory.create(
        provider=provider,
        model=slow,
        fallbacks=[{"provider": "hostile", "model": "answer", "context_window": None}],
    )
    chunks = oai.chat.completions.create(
        model=agent.name, messages=[{"role": "user", "content": LONG}], stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("t0")
    assert [r["model"] for r in hostile_requests()] == [slow]
