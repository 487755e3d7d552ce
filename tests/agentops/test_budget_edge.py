"""A cheaper alternate at the budget's edge (architecture.md §18.4): a call whose worst case is
over what the budget has left is not sent and, while an alternate's worst case still fits, the
budget does not hold: the call goes to that alternate under the fallback rules. Only when no
target fits does the budget hold. Each test counts the stand-in's requests per model."""

from __future__ import annotations

import asyncio
from collections import Counter
from decimal import Decimal
from typing import Any

import httpx
import pytest
from django.test import Client

from agentops.models import Agent, Alert, Budget
from inference.models import InferenceCall
from tests.agentops.live_asgi import asgi_server
from tests.agentops.test_budgets import chat, put_budget, spend_all_but
from tests.agentops.test_spend import priced
from tests.turns.test_auxiliary import complete
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

DEAR = "answer:text=from-the-dear-model"
CHEAP = "answer:text=from-the-cheap-model"
REFUSES = "error:status=401"
# 100 tokens out: the dear model's worst case is over 0.0015, the cheap one's under 0.0001
# (a request of a few hundred bytes at 0.1 per million in).
BUDGET = "0.001"


def edge_agent(api: Client, make_agent: Any, *alternates: str, amount: str = BUDGET) -> Agent:
    priced(api, "standin-openai", DEAR)  # 3 in, 15 out per million
    priced(api, "standin-openai", CHEAP, input_per_mtok="0.1", output_per_mtok="0.5")
    priced(api, "standin-openai", REFUSES, input_per_mtok="0.1", output_per_mtok="0.5")
    agent: Agent = make_agent(model=DEAR, max_tokens=100)
    agent.fallbacks = [
        {
            "provider": "standin-openai",
            "model": m,
            "provider_id": agent.provider_id,
            "kind": "openai",
        }
        for m in alternates
    ]
    agent.save(update_fields=["fallbacks"])
    put_budget(api, f"agents/{agent.name}", amount=amount, period="day")
    return agent


def per_model(requests: list[dict[str, Any]]) -> Counter[str]:
    return Counter(r["model"] for r in requests)


def assert_not_held(agent: Agent) -> None:
    budget = Budget.objects.get(agent=agent)
    assert budget.held_period is None, "the budget does not hold while a target fits"
    assert not Alert.objects.filter(kind="budget-exceeded").exists()


@pytest.mark.usefixtures("workers")
def test_a_turn_over_the_edge_is_served_by_the_cheaper_alternate_and_the_budget_keeps(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = edge_agent(api, make_agent, CHEAP)
    for n in range(2):
        turn = wait_turn(api, submit(api, agent.name, ("alice", f"hello {n}"))["id"])
        assert turn["status"] == "succeeded", turn
        assert turn["output"]["content"] == "from-the-cheap-model"
        assert turn["served_by"]["model"] == CHEAP
    # The dear model was never sent a request: its refusal at the edge costs a row, no call.
    assert per_model(standin_requests()) == {CHEAP: 2}
    first, second, third = InferenceCall.objects.filter(agent=agent).order_by("id")
    assert first.model == DEAR and first.error is not None
    assert first.error["type"] == "budget_edge" and first.cost == 0
    assert (
        second.route == "fallback: primary down (its worst case is over what the budget has left)"
    )
    # Sticky: the next turn goes straight to the cheap model while the primary is down.
    assert third.model == CHEAP and third.route == second.route
    assert_not_held(agent)
    budget = Budget.objects.get(agent=agent)
    assert second.cost is not None and third.cost is not None
    assert budget.spent == second.cost + third.cost and budget.reserved == 0
    assert budget.spent <= Decimal(BUDGET)
    assert Alert.objects.filter(kind="fallback-engaged", agent=agent.name).count() == 1


@pytest.mark.usefixtures("workers")
def test_when_no_target_fits_the_budget_holds_and_nothing_is_sent(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    # Left: under the cheap model's estimate too (each fits the whole amount).
    agent = edge_agent(api, make_agent, CHEAP, amount="1")
    spend_all_but(agent, "0.00001")
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"], {"held"}, timeout=20)
    assert "budget: agent" in turn["hold_reason"]
    assert standin_requests() == []
    assert Budget.objects.get(agent=agent).held_period is not None
    # Held for a reservation, not for money spent: no alert (alerts are on spend).
    assert not Alert.objects.filter(kind="budget-exceeded", agent=agent.name).exists()


@pytest.mark.usefixtures("workers")
def test_a_cheaper_alternate_that_cannot_serve_holds_the_budget_instead_of_looping(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = edge_agent(api, make_agent, REFUSES)
    # The cheap alternate refuses its key: down at once, the turn fails on it.
    failed = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert failed["status"] == "failed", failed
    # Now the primary is refused at the edge and the one target that fits is down: the
    # budget holds (one refused row), rather than refusing the primary again and again.
    turn = wait_turn(api, submit(api, agent.name, ("alice", "again"))["id"], {"held"}, timeout=20)
    assert "budget: agent" in turn["hold_reason"]
    assert per_model(standin_requests()) == {REFUSES: 1}
    refused = InferenceCall.objects.filter(agent=agent, model=DEAR)
    assert refused.count() == 2, "one refused row per turn, no loop"
    assert not Alert.objects.filter(kind="budget-exceeded", agent=agent.name).exists()


def test_complete_over_the_edge_is_served_by_the_cheaper_alternate(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = edge_agent(api, make_agent, CHEAP)
    response = complete(api, agent.name, max_tokens=100)
    assert response.status_code == 200, response.content
    assert response.json()["content"] == "from-the-cheap-model"
    assert per_model(standin_requests()) == {CHEAP: 1}
    assert_not_held(agent)


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Any:
    yield from asgi_server("budget-edge", {})


def test_a_drop_in_over_the_edge_is_served_by_the_cheaper_alternate(
    api: Client, make_agent: Any, server: str, user_token: str, standin_requests: Any
) -> None:
    agent = edge_agent(api, make_agent, CHEAP)
    response = chat(server, user_token, agent.name)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "from-the-cheap-model"
    assert per_model(standin_requests()) == {CHEAP: 1}
    assert_not_held(agent)


# --- busy: a call that fits once the calls in flight settle is not a breach (§18.1) ----------

SLOW = "answer:delay_ms=1500"


async def _parallel(url: str, token: str, body: dict[str, Any], n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {token}"}) as c:
        return await asyncio.gather(*(c.post(url, json=body) for _ in range(n)))


def test_a_burst_past_the_reservations_in_flight_is_told_to_retry_and_the_budget_keeps(
    api: Client, make_agent: Any, server: str, user_token: str, standin_requests: Any
) -> None:
    priced(api, "standin-openai", SLOW)
    agent = make_agent(model=SLOW)
    # Two calls' estimates (about 0.0019 each) fit at once, not three.
    put_budget(api, f"agents/{agent.name}", amount="0.005", period="day")
    body = {"model": agent.name, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}
    url = f"{server}/v1/chat/completions"
    responses = asyncio.run(_parallel(url, user_token, body, 4))
    statuses = sorted(r.status_code for r in responses)
    assert statuses.count(200) >= 2 and set(statuses) <= {200, 429}, statuses
    for refused in (r for r in responses if r.status_code == 429):
        # Not a hold until the reset: the SDK may retry, after a second.
        assert refused.headers.get("x-should-retry") != "false"
        assert refused.headers["retry-after"] == "1", refused.headers
        assert "after the calls in flight" in refused.text
    assert len(standin_requests()) == statuses.count(200), "a refused call is never sent"
    assert_not_held(agent)
    again = chat(server, user_token, agent.name)
    assert again.status_code == 200, again.text
    budget = Budget.objects.get(agent=agent)
    assert budget.reserved == 0 and budget.spent <= Decimal("0.005")


@pytest.mark.usefixtures("workers")
def test_a_turn_that_fits_once_another_agents_call_settles_goes_on_after_it(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    priced(api, "standin-openai", SLOW)
    first, second = make_agent(model=SLOW, max_tokens=100), make_agent(model=SLOW, max_tokens=100)
    # One turn's estimate (about 0.0019) fits the project's budget at a time, not two.
    put_budget(api, "projects/default", amount="0.003", period="day")
    turns = [submit(api, a.name, ("alice", "hello"))["id"] for a in (first, second)]
    ended = [wait_turn(api, t, timeout=60) for t in turns]
    assert [t["status"] for t in ended] == ["succeeded", "succeeded"], ended
    assert len(standin_requests()) == 2
    busy = InferenceCall.objects.filter(error__type="budget_busy")
    assert busy.exists(), "one of them waited for the other's call to settle"
    assert all(c.cost == 0 for c in busy)
    assert Budget.objects.get(project__name="default").held_period is None
    assert not Alert.objects.filter(kind="budget-exceeded").exists()
