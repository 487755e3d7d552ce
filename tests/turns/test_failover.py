"""What a fallback reports and where an overflow goes, through a real worker and the stand-in
(architecture.md §6.11): ``fallback-ended`` only once the primary answered, a silent primary
costs a return attempt's short first-content bound per interval (not the before-content
bound), and a refusal for length goes to an alternate whose window is larger than the one it
stated, on turns and ``/complete``.

Timings are scaled down: a 4 s retry interval, a 1.5 s return bound, an 8 s before-content
bound (the first call to a silent primary waits that out)."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent, Alert
from inference.models import InferenceCall
from tests.conftest import WorkerPool, wait_for, worker_pool
from tests.turns.test_auxiliary import complete
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

RETRY_MS, RETURN_MS, BEFORE_CONTENT_MS = 4000, 1500, 8000
ENV = {
    "AGENTOPS_FALLBACK_RETRY_PRIMARY_MS": str(RETRY_MS),
    "AGENTOPS_FALLBACK_RETURN_FIRST_CONTENT_MS": str(RETURN_MS),
    "AGENTOPS_INFERENCE_BOUNDS": json.dumps(
        {"progress_bounds": {"before_content_ms": BEFORE_CONTENT_MS}}
    ),
}
ALTERNATE = "answer:text=from-the-alternate"
OVERFLOWING = "window:tokens=8192,density=8"
# About 1,250 tokens as we count them, 10,000 as the primary does (eight times denser): over
# its 8,192-token window, while our estimate (plus the answer's reserve) is far inside it.
LONG = "word " * 1000
WIDE = "answer:text=from-the-wide-alternate"
NARROW = "answer:text=from-the-narrow-alternate"


@pytest.fixture(scope="module")
def failover_pool(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(1, label="failover", extra_env=ENV)


@pytest.fixture(autouse=True)
def pool(failover_pool: WorkerPool) -> WorkerPool:
    return failover_pool.routed()


def with_alternates(make_agent: Any, model: str, *targets: tuple[str, int | None]) -> Agent:
    agent: Agent = make_agent(model=model, max_tokens=256)
    agent.fallbacks = [
        {"provider": "standin-openai", "model": m, "context_window": w} for m, w in targets
    ]
    agent.save(update_fields=["fallbacks"])
    return agent


def fallback_alerts(agent: Agent) -> list[str]:
    return list(
        Alert.objects.filter(agent=agent.name, kind__startswith="fallback")
        .order_by("id")
        .values_list("kind", flat=True)
    )


def test_a_silent_primary_costs_the_short_return_bound_per_interval_and_never_ends_the_episode(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = with_alternates(make_agent, "hang", (ALTERNATE, None))
    took = []
    for i in range(10):
        started = time.monotonic()
        turn = wait_turn(api, submit(api, agent.name, ("alice", f"turn {i}"))["id"], timeout=30)
        took.append(time.monotonic() - started)
        assert turn["status"] == "succeeded", turn
        assert turn["output"]["content"] == "from-the-alternate"
        # Turns 2.5 s apart: a span of real time, over which the interval's returns are counted.
        time.sleep(max(0.0, 2.5 - took[-1]))
    assert all(t < 12 for t in took), took
    # After the first (the before-content bound), a return costs at most the return bound.
    assert all(t < RETURN_MS / 1000 + 2 for t in took[1:]), took
    primary = list(
        InferenceCall.objects.filter(agent=agent, model="hang")
        .order_by("id")
        .values("route", "error")
    )
    returns = primary[1:]
    assert len(returns) >= 3, primary
    assert all(c["route"] == "return to primary" for c in returns)
    messages = [str((c["error"] or {}).get("message")) for c in returns]
    assert all("AGENTOPS_FALLBACK_RETURN_FIRST_CONTENT_MS" in m for m in messages), messages
    assert fallback_alerts(agent) == ["fallback-engaged"]  # never a false "ended"


def primary_due(api: Client, agent: Agent) -> None:
    """Return once the agent's next call would go to its primary again (its retry interval
    passed since its latest failure), as ``GET /agents/{name}`` shows routing's choice."""
    wait_for(
        lambda: api.get(f"/api/v1/agents/{agent.name}").json()["serving"] is None,
        timeout=RETRY_MS / 1000 + 10,
        what="the primary's retry interval to pass",
    )


def test_fallback_ended_is_raised_once_the_primary_answers_not_when_a_return_is_chosen(
    api: Client, make_agent: Any, standin_requests: Any, settings: Any
) -> None:
    settings.AGENTOPS_FALLBACK_RETRY_PRIMARY_MS = RETRY_MS  # this process reads as the worker
    down = "error:status=503,times=3"
    agent = with_alternates(make_agent, down, (ALTERNATE, None))
    first = wait_turn(api, submit(api, agent.name, ("alice", "one"))["id"], timeout=30)
    assert [c["model"] for c in first["calls"]] == [down, down, ALTERNATE]
    assert fallback_alerts(agent) == ["fallback-engaged"]

    primary_due(api, agent)
    # The return attempt fails (the third 503): back to the alternate, nothing "ended".
    second = wait_turn(api, submit(api, agent.name, ("alice", "two"))["id"], timeout=30)
    assert second["calls"][0]["route"] == "return to primary"
    assert [c["model"] for c in second["calls"]] == [down, ALTERNATE]
    assert fallback_alerts(agent) == ["fallback-engaged"]

    primary_due(api, agent)
    third = wait_turn(api, submit(api, agent.name, ("alice", "three"))["id"], timeout=30)
    assert [c["model"] for c in third["calls"]] == [down]
    assert third["status"] == "succeeded"
    assert fallback_alerts(agent) == ["fallback-engaged", "fallback-ended"]
    ended = Alert.objects.get(agent=agent.name, kind="fallback-ended")
    assert ended.data["call"] == third["calls"][0]["id"]


@pytest.mark.parametrize("policy", ["trim", "fail"])
def test_a_turn_refused_for_length_goes_to_the_alternate_larger_than_the_stated_window(
    api: Client, make_agent: Any, standin_requests: Any, policy: str
) -> None:
    agent = with_alternates(make_agent, OVERFLOWING, (NARROW, 8000), (WIDE, 32000))
    Agent.objects.filter(pk=agent.pk).update(context_policy=policy)
    turn = wait_turn(api, submit(api, agent.name, ("alice", LONG))["id"], timeout=30)
    assert turn["status"] == "succeeded", turn
    assert turn["output"]["content"] == "from-the-wide-alternate"
    assert Counter(r["model"] for r in standin_requests()) == {OVERFLOWING: 1, WIDE: 1}


def test_complete_refused_for_length_goes_to_the_alternate_larger_than_the_stated_window(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = with_alternates(make_agent, OVERFLOWING, (NARROW, 8000), (WIDE, 32000))
    messages = [{"participant": "alice", "content": LONG}]
    answered = complete(api, agent.name, messages=messages)
    assert answered.status_code == 200, answered.content
    assert answered.json()["content"] == "from-the-wide-alternate"
    assert Counter(r["model"] for r in standin_requests()) == {OVERFLOWING: 1, WIDE: 1}
    # None larger: the provider's refusal, one call.
    narrow_only = with_alternates(make_agent, OVERFLOWING, (NARROW, 8192))
    refused = complete(api, narrow_only.name, messages=messages)
    assert refused.status_code == 502, refused.content
    assert Counter(r["model"] for r in standin_requests()) == {OVERFLOWING: 2, WIDE: 1}
