"""Budgets held by reservation (architecture.md §18, API.md Budgets): a call that may cost
reserves its worst case before it is sent, under a row lock; its real cost replaces the
reservation when its row ends; a call that does not fit is never sent."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Generator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, cast

import httpx
import pytest
from django.test import Client

from agentops.budget_core import period_bounds
from agentops.models import Alert, AuditEntry, Budget, HistoryRow, Provider
from breaker.probe_call import probe_send
from breaker.probes import breaker_probe_begin
from calls.compile import compile_request
from inference.models import InferenceCall, Turn
from tests.agentops.live_asgi import asgi_server
from tests.agentops.test_spend import priced
from tests.factories import AgentFactory, HistoryRowFactory, ProviderFactory, TurnFactory
from tests.turns.test_auxiliary import complete
from tests.turns.test_turns import submit, wait_turn
from tests.waits.test_admin import staff
from turns.context.summary import context_summary
from turns.runtime import TurnRuntime
from waits.admission import admission_check

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


def chat(server: str, token: str, agent: str) -> httpx.Response:
    """A chat completion through the drop-in, 100 tokens at most."""
    return httpx.post(
        f"{server}/v1/chat/completions",
        json={"model": agent, "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {token}"},
        timeout=30,
    )


def put_budget(api: Client, path: str, **body: Any) -> Any:
    return api.put(f"/api/v1/{path}/budget", data=json.dumps(body), content_type="application/json")


# --- periods, pure --------------------------------------------------------------------------


def test_periods_are_calendar_aligned_in_the_configured_time_zone() -> None:
    at = datetime(2026, 3, 29, 0, 30, tzinfo=UTC)  # a Sunday; 01:30 in Paris, before DST
    start, end = period_bounds("day", at, "UTC")
    assert (start, end) == (datetime(2026, 3, 29, tzinfo=UTC), datetime(2026, 3, 30, tzinfo=UTC))
    start, end = period_bounds("week", at, "UTC")
    assert (start.day, end.day) == (23, 30)  # Monday to Monday
    start, end = period_bounds("month", datetime(2026, 12, 31, 23, 59, tzinfo=UTC), "UTC")
    assert (start, end) == (datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    # Paris's day of the DST change is 23 hours long, from local midnight to local midnight.
    start, end = period_bounds("day", at, "Europe/Paris")
    assert start == datetime(2026, 3, 28, 23, tzinfo=UTC)
    assert end == datetime(2026, 3, 29, 22, tzinfo=UTC)


# --- the API --------------------------------------------------------------------------------


def test_a_budget_is_put_read_and_deleted_by_an_operator(
    api: Client, make_agent: Any, user_token: str
) -> None:
    agent = make_agent()
    made = put_budget(api, f"agents/{agent.name}", amount="12.50", period="day")
    assert made.status_code == 200, made.content
    body = made.json()
    assert (body["amount"], body["period"], body["warn_at"]) == ("12.5", "day", 0.8)
    assert (body["spent"], body["reserved"], body["held"]) == ("0", "0", False)
    assert api.get(f"/api/v1/agents/{agent.name}/budget").json()["amount"] == "12.5"
    project = put_budget(api, "projects/default", amount=100, period="month", warn_at=0.5)
    assert project.status_code == 200 and project.json()["warn_at"] == 0.5
    user = Client(headers={"Authorization": f"Bearer {user_token}"})
    assert put_budget(user, f"agents/{agent.name}", amount="1", period="day").status_code == 403
    assert user.get(f"/api/v1/agents/{agent.name}/budget").status_code == 403
    assert api.delete(f"/api/v1/agents/{agent.name}/budget").status_code == 204
    assert api.get(f"/api/v1/agents/{agent.name}/budget").status_code == 404
    assert put_budget(api, "agents/nobody", amount="1", period="day").status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"period": "day"}, "amount"),
        ({"amount": "-1", "period": "day"}, "amount"),
        ({"amount": "NaN", "period": "day"}, "amount"),
        ({"amount": "ten", "period": "day"}, "amount"),
        ({"amount": "1", "period": "year"}, "period"),
        ({"amount": "1", "period": "day", "warn_at": 1.5}, "warn_at"),
        ({"amount": "1", "period": "day", "cap": 1}, "cap"),
    ],
)
def test_a_bad_budget_is_a_400_naming_the_field_and_nothing_changes(
    api: Client, make_agent: Any, body: dict[str, Any], field: str
) -> None:
    agent = make_agent()
    response = put_budget(api, f"agents/{agent.name}", **body)
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == field
    assert not Budget.objects.exists()


# --- the ledger -----------------------------------------------------------------------------


def test_a_call_replaces_its_reservation_by_its_cost(api: Client, make_agent: Any) -> None:
    priced(api, "standin-openai", "answer")
    agent = make_agent()
    put_budget(api, f"agents/{agent.name}", amount="1", period="day")
    assert complete(api, agent.name, max_tokens=100).status_code == 200
    row = InferenceCall.objects.get(agent=agent)
    assert row.reserved is not None and row.cost is not None and 0 < row.cost < row.reserved
    budget = api.get(f"/api/v1/agents/{agent.name}/budget").json()
    assert Decimal(budget["spent"]) == row.cost and budget["reserved"] == "0"


def spend_all_but(agent: Any, left: str) -> None:
    """Arrange a day whose calls so far (before the test) spent all of the agent's budget but
    ``left``: less than one call's estimate, more than nothing."""
    budget = Budget.objects.get(agent=agent)
    Budget.objects.filter(pk=budget.pk).update(spent=budget.amount - Decimal(left))


def test_a_call_that_does_not_fit_is_never_sent_and_the_budget_holds_saying_why(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    priced(api, "standin-openai", "answer")
    agent = make_agent()
    put_budget(api, f"agents/{agent.name}", amount="1", period="day")
    spend_all_but(agent, "0.001")  # 100 tokens out at 15 per million is 0.0015 alone
    refused = complete(api, agent.name, max_tokens=100)
    assert refused.status_code != 200, refused.content
    assert standin_requests() == [], "nothing was sent"
    row = InferenceCall.objects.get(agent=agent)
    assert row.error is not None and row.error["type"] == "budget" and row.cost == 0
    budget = api.get(f"/api/v1/agents/{agent.name}/budget").json()
    assert budget["held"] is True and (budget["spent"], budget["reserved"]) == ("0.999", "0")
    assert budget["left"] == "0.001" and Decimal(budget["refused_estimate"]) > Decimal("0.0015")
    # The hold says why in numbers: spent, reserved, left and the call's estimate.
    (hold,) = api.get(f"/api/v1/agents/{agent.name}").json()["holds"]
    assert "spent 0.999, reserved 0, 0.001 left" in hold["reason"], hold["reason"]
    assert budget["refused_estimate"] in hold["reason"]
    # A refusal for a reservation is not an alert: nothing was spent past the amount.
    assert not Alert.objects.filter(kind__startswith="budget").exists()
    # Raising the budget lifts the hold: the next call goes out.
    put_budget(api, f"agents/{agent.name}", amount="2", period="day")
    assert complete(api, agent.name, max_tokens=100).status_code == 200


def test_a_budget_set_after_calls_counts_what_the_period_already_spent(
    api: Client, make_agent: Any
) -> None:
    priced(api, "standin-openai", "answer")
    agent = make_agent()
    for _ in range(2):
        assert complete(api, agent.name, max_tokens=10).status_code == 200
    before = sum(r.cost for r in InferenceCall.objects.filter(agent=agent) if r.cost is not None)
    assert before > 0
    set_ = put_budget(api, f"agents/{agent.name}", amount="1", period="day").json()
    assert Decimal(set_["spent"]) == before, "a budget set at noon counts the morning"
    # Another period starts from that period's calls, not from 0; the project's counts them too.
    assert (
        Decimal(put_budget(api, f"agents/{agent.name}", amount="1", period="month").json()["spent"])
        == before
    )
    assert (
        Decimal(put_budget(api, "projects/default", amount="1", period="week").json()["spent"])
        == before
    )
    # Set again in the same period, the ledger is kept (not read again from the rows).
    assert complete(api, agent.name, max_tokens=10).status_code == 200
    after = sum(r.cost for r in InferenceCall.objects.filter(agent=agent) if r.cost is not None)
    assert (
        Decimal(put_budget(api, f"agents/{agent.name}", amount="2", period="month").json()["spent"])
        == after
    )


def test_a_projects_budget_counts_every_agent_of_the_project(api: Client, make_agent: Any) -> None:
    priced(api, "standin-openai", "answer")
    first, second = make_agent(), make_agent()
    put_budget(api, "projects/default", amount="0.01", period="month")
    assert complete(api, first.name, max_tokens=100).status_code == 200
    assert complete(api, second.name, max_tokens=100).status_code == 200
    spent = sum(r.cost for r in InferenceCall.objects.all() if r.cost is not None)
    assert Decimal(api.get("/api/v1/projects/default/budget").json()["spent"]) == spent


def test_the_warning_is_raised_on_money_spent_once_per_period(api: Client, make_agent: Any) -> None:
    priced(api, "standin-openai", "answer")
    agent = make_agent()
    # Warns at 0.0002: one call's reservation (about 0.0002) reaches it, its cost (about
    # 0.00017) does not; two calls' costs do.
    put_budget(api, f"agents/{agent.name}", amount="0.004", period="day", warn_at="0.05")
    assert complete(api, agent.name, max_tokens=10).status_code == 200
    assert not Alert.objects.filter(kind="budget-warning").exists(), "not on a reservation"
    for _ in range(2):
        assert complete(api, agent.name, max_tokens=10).status_code == 200
    (warning,) = Alert.objects.filter(kind="budget-warning", agent=agent.name)
    assert "has spent" in warning.message


def test_an_unpriced_call_a_budget_counts_is_refused_by_name_unless_allowed(
    api: Client, make_agent: Any, standin_requests: Any, settings: Any
) -> None:
    agent = make_agent()
    put_budget(api, f"agents/{agent.name}", amount="10", period="day")
    refused = complete(api, agent.name, max_tokens=100)
    assert refused.status_code == 400, refused.content
    assert refused.json()["data"]["field"] == "model"
    assert "no price in force" in refused.json()["message"]
    assert standin_requests() == [], "nothing was sent"
    assert api.get(f"/api/v1/agents/{agent.name}/budget").json()["held"] is False
    # allow: sent, unbounded and uncounted, as documented.
    settings.AGENTOPS_BUDGET_UNPRICED = "allow"
    assert complete(api, agent.name, max_tokens=100).status_code == 200
    row = InferenceCall.objects.filter(agent=agent).last()
    assert row is not None and (row.reserved, row.cost) == (None, None)


# --- a spent budget is a hold, like a provider wait ------------------------------------------


def spent_agent(api: Client, make_agent: Any, provider: str = "standin-openai") -> Any:
    """An agent whose budget a call did not fit: held on every model until the day resets."""
    priced(api, provider, "answer")
    agent = (
        make_agent(provider=provider.removeprefix("standin-"))
        if provider in ("standin-openai", "standin-anthropic")
        else AgentFactory.create(provider=Provider.objects.get(name=provider), model="answer")
    )
    put_budget(api, f"agents/{agent.name}", amount="1", period="day")
    spend_all_but(agent, "0.001")
    assert complete(api, agent.name, max_tokens=100).status_code != 200
    return agent


def resets_at(api: Client, agent: Any) -> datetime:
    return datetime.fromisoformat(
        api.get(f"/api/v1/agents/{agent.name}/budget").json()["resets_at"]
    )


def test_a_spent_budget_is_a_binding_wait_on_every_model_until_the_reset(
    api: Client, make_agent: Any
) -> None:
    agent = spent_agent(api, make_agent)
    (wait,) = api.get(f"/api/v1/waits?agent={agent.name}").json()["waits"]
    assert wait["model"] == "*" and wait["reason"].startswith("budget")
    assert datetime.fromisoformat(wait["until"]) == resets_at(api, agent)
    (hold,) = api.get(f"/api/v1/agents/{agent.name}").json()["holds"]
    assert hold["reason"] == wait["reason"]


def test_a_held_complete_and_summary_are_refused_without_a_call(
    runtime: TurnRuntime, api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = spent_agent(api, make_agent)
    assert len(standin_requests()) == 0
    refused = complete(api, agent.name, max_tokens=10)
    assert refused.status_code == 429, refused.content
    assert datetime.fromisoformat(refused.json()["data"]["until"]) == resets_at(api, agent)
    summary = asyncio.run(context_summary(runtime, agent=agent, rows=[], budget_tokens=100))
    assert summary is None
    assert standin_requests() == [], "nothing was sent"
    assert InferenceCall.objects.filter(agent=agent, outcome="deferred").count() == 2


def test_a_held_probe_is_deferred(
    runtime: TurnRuntime, api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = spent_agent(api, make_agent)
    HistoryRowFactory.create(agent=agent, seq=1, participant="alice", content="hello")
    failed = compile_request(agent, HistoryRow.objects.filter(agent=agent).order_by("seq"))
    turn = TurnFactory.create(agent=agent, status=Turn.Status.RUNNING)
    outcome = asyncio.run(
        probe_send(runtime, turn=turn, failed=failed, ticket=breaker_probe_begin(agent=agent))
    )
    assert outcome.outcome == "deferred"
    assert standin_requests() == []


def test_the_admin_lists_a_budget_hold_and_releases_it_with_a_reason(
    api: Client, make_agent: Any
) -> None:
    agent = spent_agent(api, make_agent)
    admin = staff("grace", "view_waitjournalentry", "release_wait")
    listed = admin.get("/admin/waits/bindingwait/")
    assert listed.status_code == 200 and "budget: agent" in listed.content.decode()
    done = admin.post(
        "/admin/waits/bindingwait/release/",
        {"agent": agent.name, "model": "*", "reason": "approved overspend"},
    )
    assert done.status_code == 302, done.content
    audit = AuditEntry.objects.get(action="wait.release")
    assert (audit.actor, audit.reason) == ("admin:grace", "approved overspend")
    assert admission_check(agent=agent, model="answer", now_ms=time.time() * 1000) is None
    assert complete(api, agent.name, max_tokens=100).status_code == 200


@pytest.mark.usefixtures("workers")
def test_a_held_turn_waits_until_the_reset_and_a_release_resumes_it(
    api: Client, make_agent: Any
) -> None:
    agent = spent_agent(api, make_agent)
    turn_id = submit(api, agent.name, ("alice", "hello"))["id"]
    held = wait_turn(api, turn_id, {"held"}, timeout=20)
    assert datetime.fromisoformat(held["held_until"]) == resets_at(api, agent)
    assert held["hold_reason"].startswith("budget: "), "a budget, not a provider's wait"
    spent_before = Budget.objects.get(agent=agent).spent
    released = api.post(
        "/api/v1/waits/release",
        data=json.dumps({"agent": agent.name, "reason": "let it finish"}),
        content_type="application/json",
    )
    assert released.status_code == 200, released.content
    assert [r["model"] for r in released.json()["receipts"]] == ["*"]
    audit = AuditEntry.objects.get(action="wait.release", target=f"{agent.name}/*")
    assert audit.reason == "let it finish" and audit.data["receipts"][0]["model"] == "*"
    assert wait_turn(api, turn_id, timeout=30)["status"] == "succeeded"
    # Released for the rest of the period: its calls go out though the reservation would not
    # fit, and they count (the hold came from the worst case, not the spent amount).
    budget = Budget.objects.get(agent=agent)
    assert budget.spent > spent_before
    assert api.get(f"/api/v1/waits?agent={agent.name}").json()["waits"] == []


@pytest.mark.usefixtures("workers")
def test_a_turns_call_that_does_not_fit_is_not_sent_and_the_turn_is_held(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    priced(api, "standin-openai", "answer")
    agent = make_agent(max_tokens=100)
    put_budget(api, f"agents/{agent.name}", amount="1", period="day")
    spend_all_but(agent, "0.001")
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"], {"held"}, timeout=20)
    assert datetime.fromisoformat(turn["held_until"]) == resets_at(api, agent)
    assert standin_requests() == []
    # Raising the budget lifts the hold: the held turn goes on.
    put_budget(api, f"agents/{agent.name}", amount="2", period="day")
    assert wait_turn(api, turn["id"], timeout=10)["status"] == "succeeded"


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Any:
    yield from asgi_server("budgets", {})


@pytest.mark.parametrize(
    ("path", "provider", "body"),
    [
        ("/v1/chat/completions", "openai", {"messages": [{"role": "user", "content": "hi"}]}),
        (
            "/v1/messages",
            "anthropic",
            {"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
        ),
        ("/v1/responses", "responses", {"input": "hi"}),
    ],
)
def test_a_held_drop_in_answers_429_not_to_retry_with_the_reset_instant(
    api: Client,
    make_agent: Any,
    server: str,
    user_token: str,
    standin_requests: Any,
    standin: str,
    path: str,
    provider: str,
    body: dict[str, Any],
) -> None:
    if provider == "responses":
        ProviderFactory.create(
            name="standin-responses", kind="openai-responses", base_url=f"{standin}/v1"
        )
    agent = spent_agent(api, make_agent, f"standin-{provider}")
    response = httpx.post(
        f"{server}{path}",
        json={**body, "model": agent.name},
        headers={"authorization": f"Bearer {user_token}", "x-api-key": user_token},
        timeout=20,
    )
    assert response.status_code == 429, response.text
    assert response.headers["x-should-retry"] == "false"
    reset = resets_at(api, agent)
    assert "budget" in response.text and reset.isoformat()[:16] in response.text.replace(" ", "T")
    assert standin_requests() == []


def test_a_drop_in_call_that_does_not_fit_answers_429_not_to_retry(
    api: Client, make_agent: Any, server: str, user_token: str, standin_requests: Any
) -> None:
    priced(api, "standin-openai", "answer")
    agent = make_agent()
    put_budget(api, f"agents/{agent.name}", amount="1", period="day")
    spend_all_but(agent, "0.001")
    response = chat(server, user_token, agent.name)
    assert response.status_code == 429, response.text
    assert response.headers["x-should-retry"] == "false"
    assert 0 < int(response.headers["retry-after"]) <= 86_400
    assert standin_requests() == []
    row = InferenceCall.objects.get(agent=agent)
    assert row.error is not None and row.error["type"] == "budget"


# --- 200 calls from 4 processes at the budget's edge ----------------------------------------

SERVERS = 4
PER_SERVER = 50


@pytest.fixture(scope="module")
def servers(django_db_setup: None, django_db_blocker: Any) -> Any:
    # Four processes, each its own connection pool: the lock is all that serializes them.
    gens = [asgi_server(f"budgets-{i}", {}) for i in range(SERVERS)]
    try:
        yield [next(g) for g in gens]
    finally:
        for g in gens:
            cast(Generator[str], g).close()


async def _burst(targets: list[tuple[str, dict[str, Any]]], token: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=len(targets))
    async with httpx.AsyncClient(
        timeout=120, limits=limits, headers={"authorization": f"Bearer {token}"}
    ) as client:
        return await asyncio.gather(*(client.post(url, json=body) for url, body in targets))


def test_two_hundred_calls_from_four_processes_never_overspend(
    api: Client, make_agent: Any, servers: list[str], operator_token: str
) -> None:
    priced(api, "standin-openai", "answer:delay_ms=200")
    agents = [make_agent(model="answer:delay_ms=200") for _ in range(2)]
    amount = Decimal("0.02")
    for agent in agents:
        put_budget(api, f"agents/{agent.name}", amount=str(amount), period="day")
    # Real text, about 1,000 characters: its estimate is characters/4, not its bytes.
    prose = "An agent summarises what its operator asked for, in plain English. " * 15
    body = {"messages": [{"participant": "alice", "content": prose}], "max_tokens": 100}
    targets = [
        (f"{servers[i % SERVERS]}/api/v1/agents/{agents[i % 2].name}/complete", body)
        for i in range(SERVERS * PER_SERVER)
    ]
    responses = asyncio.run(_burst(targets, operator_token))
    statuses = [r.status_code for r in responses]
    assert statuses.count(200) > 10, "some calls fit"
    assert len(statuses) - statuses.count(200) > 10, "the budgets were at their edge"
    for agent in agents:
        rows = list(InferenceCall.objects.filter(agent=agent))
        assert len(rows) == SERVERS * PER_SERVER // 2, "every call has its row"
        spent = sum((r.cost for r in rows if r.cost is not None), Decimal(0))
        # The bound architecture.md §18.1 states: past the amount by at most what the
        # estimates of the calls that ran under-counted (cost over reservation).
        error = sum(
            (max(r.cost - r.reserved, Decimal(0)) for r in rows if r.cost and r.reserved),
            Decimal(0),
        )
        print(
            f"spent {spent} of {amount}: over by {max(spent - amount, 0)}, estimate error {error}"
        )
        assert spent <= amount + error
        budget = Budget.objects.get(agent=agent)
        # The ledger is the sum of the call rows, to the cent (and exactly), none in flight.
        assert (budget.spent, budget.reserved) == (spent, 0)
