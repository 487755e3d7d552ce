"""Spend, second pass (issue 55; architecture.md §18.1): a call reserves what it will likely
cost, not its byte count; a budget says what happened in numbers; and each way a budget leaked
(``n``, no ``max_tokens``, an unpriced model, a period changed mid-flight, a ``max_tokens`` over
the whole budget, NUL in a budget path) replayed against real servers."""

from __future__ import annotations

import asyncio
import json
import threading
from decimal import Decimal
from typing import Any

import httpx
import pytest
from django.test import Client

from agentops.models import Budget
from inference.models import InferenceCall
from tests.agentops.live_asgi import asgi_server
from tests.agentops.test_budgets import put_budget
from tests.agentops.test_spend import priced
from tests.conftest import wait_for
from tests.turns.test_auxiliary import complete

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

# About 4,000 characters of prose: the stand-in, like a provider, counts it ~1,000 tokens.
PROSE = (
    "An operator reads the spend of a long-running agent at the end of the day and wants "
    "to know why a budget held. "
) * 36
ANSWER = "answer:text=The answer is short and forty characters."


def test_the_issues_case_a_budget_of_two_turns_lets_the_first_turns_through(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    # 1,000 tokens in at 1,200 per million is 1.20; 10 out at 40,000 per million is 0.40.
    priced(api, "standin-openai", ANSWER, input_per_mtok="1200", output_per_mtok="40000")
    agent = make_agent(model=ANSWER)
    put_budget(api, f"agents/{agent.name}", amount="4", period="day")
    messages = [{"participant": "alice", "content": PROSE}]
    first_answer = complete(api, agent.name, max_tokens=10, messages=messages)
    assert first_answer.status_code == 200, first_answer.content  # not its byte count
    statuses = [first_answer.status_code]
    first = InferenceCall.objects.get(agent=agent)
    assert first.cost is not None and Decimal("1.5") < first.cost < Decimal("1.7")
    assert first.reserved is not None and first.reserved < Decimal("2.2")
    for _ in range(3):
        statuses.append(complete(api, agent.name, max_tokens=10, messages=messages).status_code)
    assert statuses[:2] == [200, 200] and 200 not in statuses[2:], statuses
    budget = api.get(f"/api/v1/agents/{agent.name}/budget").json()
    spent = Decimal(budget["spent"])
    assert spent <= Decimal(4), "held before spend passed the amount"
    assert budget["held"] is True and Decimal(budget["refused_estimate"]) > Decimal(budget["left"])
    (hold,) = api.get(f"/api/v1/agents/{agent.name}").json()["holds"]
    assert f"spent {budget['spent']}, reserved 0, {budget['left']} left" in hold["reason"]
    assert budget["refused_estimate"] in hold["reason"]
    assert len(standin_requests()) == 2


def test_a_max_tokens_that_alone_cannot_fit_is_a_400_naming_it_and_holds_nothing(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    priced(api, "standin-openai", "answer")
    agent = make_agent()
    put_budget(api, f"agents/{agent.name}", amount="10", period="day")
    refused = complete(api, agent.name, max_tokens=1_000_000)  # 18.75 alone at 15 per million
    assert refused.status_code == 400, refused.content
    body = refused.json()
    assert body["data"]["field"] == "max_tokens" and "whole budget of 10" in body["message"]
    assert standin_requests() == []
    budget = api.get(f"/api/v1/agents/{agent.name}/budget").json()
    assert (budget["held"], budget["reserved"]) == (False, "0")
    assert complete(api, agent.name, max_tokens=100).status_code == 200, "nothing holds"


@pytest.mark.parametrize("path", ["agents/a\x00b", "projects/p\x00q", "agents/a\x1bb"])
def test_a_nul_or_control_in_a_budget_path_is_a_404_not_a_500(api: Client, path: str) -> None:
    for method in (api.get, api.delete):
        assert method(f"/api/v1/{path}/budget").status_code == 404
    assert put_budget(api, path, amount="1", period="day").status_code == 404


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Any:
    yield from asgi_server("budget-estimate", {})


def chat(server: str, token: str, **body: Any) -> httpx.Response:
    return httpx.post(
        f"{server}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], **body},
        headers={"authorization": f"Bearer {token}"},
        timeout=30,
    )


def test_n_completions_reserve_n_and_one_that_cannot_fit_is_refused(
    api: Client, make_agent: Any, server: str, user_token: str, standin_requests: Any
) -> None:
    priced(api, "standin-openai", "answer")
    agent = make_agent()
    # One completion of 100 tokens reserves about 0.0019: ten, 0.019, over the whole amount.
    put_budget(api, f"agents/{agent.name}", amount="0.01", period="day")
    refused = chat(server, user_token, model=agent.name, max_tokens=100, n=10)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "max_tokens"
    assert standin_requests() == []
    ok = chat(server, user_token, model=agent.name, max_tokens=100, n=2)
    assert ok.status_code == 200, ok.text
    row = InferenceCall.objects.get(agent=agent, outcome="completed")
    assert row.reserved is not None and row.reserved > 2 * Decimal("0.0015") * Decimal("1.25")


def test_a_budgeted_call_without_max_tokens_is_sent_with_what_it_reserved(
    api: Client, make_agent: Any, server: str, user_token: str, standin_requests: Any
) -> None:
    priced(api, "standin-openai", "answer")
    agent = make_agent(max_tokens=None)
    put_budget(api, f"agents/{agent.name}", amount="10", period="day")
    assert chat(server, user_token, model=agent.name).status_code == 200
    (sent,) = standin_requests()
    # The provider cannot bill past the reservation: it was told the bound reserved for.
    assert sent["body"]["max_tokens"] == 4096, sent
    assert InferenceCall.objects.get(agent=agent).max_tokens == 4096
    # Without a budget, the request goes as the client wrote it.
    other = make_agent(max_tokens=None)
    assert chat(server, user_token, model=other.name).status_code == 200
    assert "max_tokens" not in standin_requests()[-1]["body"]


SLOW = "answer:delay_ms=1500"


def test_a_period_changed_with_six_calls_in_flight_never_goes_negative(
    api: Client, make_agent: Any, server: str, user_token: str
) -> None:
    priced(api, "standin-openai", SLOW)
    agent = make_agent(model=SLOW)
    put_budget(api, f"agents/{agent.name}", amount="1", period="day")

    async def six() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            timeout=30, headers={"authorization": f"Bearer {user_token}"}
        ) as c:
            body = {
                "model": agent.name,
                "max_tokens": 100,
                "messages": [{"role": "user", "content": "hi"}],
            }
            return await asyncio.gather(
                *(c.post(f"{server}/v1/chat/completions", json=body) for _ in range(6))
            )

    results: list[list[httpx.Response]] = []
    burst = threading.Thread(target=lambda: results.append(asyncio.run(six())))
    burst.start()
    wait_for(
        lambda: Budget.objects.get(agent=agent).reserved >= 6 * Decimal("0.0015"),
        timeout=10,
        interval=0.02,
        what="the six calls to reserve",
    )
    # Day to week and back: the second ledger starts on the same instant as the first (as a
    # Monday's day and week do), while the six calls are still in flight.
    put_budget(api, f"agents/{agent.name}", amount="1", period="week")
    put_budget(api, f"agents/{agent.name}", amount="1", period="day")
    burst.join()
    assert [r.status_code for r in results[0]] == [200] * 6
    budget = Budget.objects.get(agent=agent)
    assert budget.reserved == 0, "the calls settled on the ledger they reserved on, or on none"
    assert budget.spent >= 0
    assert (
        json.loads(json.dumps(api.get(f"/api/v1/agents/{agent.name}/budget").json()))["reserved"]
        == "0"
    )
