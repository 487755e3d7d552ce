"""Prices, the cost of every call and spend read back (architecture.md §17, API.md Spend):
every endpoint's calls are costed (turns, /complete, the three drop-ins, the breaker's probe),
at the price of what served them, exact in Decimal; unpriced is null, never 0."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import anthropic
import openai
import pytest
from django.test import Client
from django.utils import timezone

from agentops.budget_core import reservation_estimate
from agentops.models import Agent, HistoryRow, Price, Provider
from agentops.prices import Basis, Terms, call_cost
from agentops.tokens import api_token_create
from breaker.probe_call import probe_send
from breaker.probes import breaker_probe_begin
from calls.compile import compile_request
from inference.models import InferenceCall, Turn
from tests.agentops.live_asgi import asgi_server
from tests.conftest import scraper, wait_for
from tests.factories import AgentFactory, HistoryRowFactory, ProviderFactory, TurnFactory
from tests.interfaces.api.test_alerts_api import IN_RANGE, OUT_OF_RANGE
from tests.turns.test_auxiliary import complete
from tests.turns.test_turns import submit, wait_turn
from turns.runtime import TurnRuntime

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

PRICE = {
    "input_per_mtok": "3",
    "output_per_mtok": "15",
    "cached_input_per_mtok": "0.3",
    "reasoning_per_mtok": "12.5",
}


def post_price(api: Client, **body: Any) -> Any:
    return api.post("/api/v1/prices", data=json.dumps(body), content_type="application/json")


def priced(api: Client, provider: str, model: str, **amounts: Any) -> dict[str, Any]:
    response = post_price(api, provider=provider, model=model, **(amounts or PRICE))
    assert response.status_code == 201, response.content
    body: dict[str, Any] = response.json()
    return body


def expected_cost(row: InferenceCall, price: dict[str, Any]) -> Decimal:
    """The cost worked out here from the row's usage, part by part (not by the code under
    test): cached input and cache writes are part of input and reasoning part of output."""
    p = {k: Decimal(str(v)) for k, v in price.items() if k.endswith("_per_mtok") and v is not None}
    cached_at = p.get("cached_input_per_mtok", p["input_per_mtok"])
    written_at = p.get("cache_write_per_mtok", p["input_per_mtok"])
    reasoning_at = p.get("reasoning_per_mtok", p["output_per_mtok"])
    inp, out = row.input_tokens or 0, row.output_tokens or 0
    cached, reasoning = row.cached_input_tokens or 0, row.reasoning_tokens or 0
    written = row.cache_write_tokens or 0
    total = (
        (inp - cached - written) * p["input_per_mtok"]
        + cached * cached_at
        + written * written_at
        + (out - reasoning) * p["output_per_mtok"]
        + reasoning * reasoning_at
    )
    return total / Decimal(1_000_000)


def assert_costed(row: InferenceCall, price: dict[str, Any]) -> None:
    assert row.input_tokens and row.output_tokens, "the stand-in reports usage"
    assert row.price_id == price["id"]
    assert row.cost_basis == "priced"
    assert row.cost == expected_cost(row, price) and row.cost > 0


def spend(client: Client, **query: str) -> dict[str, Any]:
    response = client.get("/api/v1/spend", query)
    assert response.status_code == 200, response.content
    body: dict[str, Any] = response.json()
    return body


def spend_of(client: Client, key: str, group_by: str = "agent") -> dict[str, Any]:
    items = {i["key"]: i for i in spend(client, group_by=group_by)["items"]}
    return items[key]


# --- the cost, pure -------------------------------------------------------------------------


TERMS = Terms(
    id=1,
    input=Decimal("3"),
    output=Decimal("15"),
    cached_input=Decimal("0.3"),
    reasoning=Decimal("10"),
    currency="USD",
    effective_from=timezone.now(),
)


def cost(terms: Terms | None = TERMS, *, answered: bool = True, **usage: int | None) -> Any:
    counts: dict[str, int | None] = {
        "input_tokens": None,
        "output_tokens": None,
        "reasoning_tokens": None,
        "cached_input_tokens": None,
        "cache_write_tokens": None,
    }
    counts.update(usage)
    return call_cost(**counts, answered=answered, terms=terms)  # type: ignore[arg-type]


def test_each_part_is_billed_once_at_its_own_price_exactly() -> None:
    got = cost(
        input_tokens=1_234_567,
        cached_input_tokens=1_000_000,
        output_tokens=7_654_321,
        reasoning_tokens=54_321,
    )
    # 234567 x 3 + 1000000 x 0.3 + 7600000 x 15 + 54321 x 10, per million.
    assert got.amount == Decimal("115.546911")
    assert (got.price_id, got.basis) == (1, Basis.PRICED)


def test_cached_and_reasoning_fall_back_to_the_input_and_output_prices() -> None:
    plain = Terms(**{**TERMS.__dict__, "cached_input": None, "reasoning": None})
    got = cost(
        plain, input_tokens=100, cached_input_tokens=40, output_tokens=10, reasoning_tokens=4
    )
    assert got.amount == Decimal("0.00045")  # (100 x 3 + 10 x 15) / 10^6


def test_cache_writes_are_billed_at_their_own_price_else_at_the_input_price() -> None:
    written = Terms(**{**TERMS.__dict__, "cache_write": Decimal("3.75")})
    got = cost(written, input_tokens=1000, cached_input_tokens=200, cache_write_tokens=300)
    # 500 x 3 + 200 x 0.3 + 300 x 3.75, per million.
    assert got.amount == Decimal("0.002685")
    plain = cost(input_tokens=1000, cached_input_tokens=200, cache_write_tokens=300)
    assert plain.amount == Decimal("0.00246")  # (800 x 3 + 200 x 0.3) / 10^6


def test_a_reservation_is_the_likely_cost_with_its_margin_and_counts_every_choice() -> None:
    one = reservation_estimate(
        input_tokens=1000, max_tokens=100, choices=1, terms=TERMS, margin_percent=25
    )
    assert one.amount == Decimal("0.005625")  # (1000 x 3 + 100 x 15) x 1.25, per million
    assert one.output == Decimal("0.001875")  # 100 x 15 x 1.25: what max_tokens alone costs
    # n: 10 is billed ten completions (the input once): it reserves ten.
    ten = reservation_estimate(
        input_tokens=1000, max_tokens=100, choices=10, terms=TERMS, margin_percent=25
    )
    assert ten.output == 10 * one.output
    assert ten.amount == Decimal("0.00375") + 10 * one.output
    bare = reservation_estimate(
        input_tokens=1000, max_tokens=100, choices=1, terms=TERMS, margin_percent=0
    )
    assert bare.amount == cost(input_tokens=1000, output_tokens=100).amount


def test_below_the_cent_nothing_is_rounded() -> None:
    tiny = Terms(**{**TERMS.__dict__, "input": Decimal("0.000001"), "output": Decimal("0.000003")})
    assert cost(tiny, input_tokens=1, output_tokens=0).amount == Decimal("1E-12")
    huge = cost(input_tokens=2**62, output_tokens=2**62).amount
    assert huge == Decimal(2**62) * 18 / Decimal(10**6)


def test_no_price_is_unknown_never_zero_and_no_answer_costs_nothing() -> None:
    assert cost(None, input_tokens=10, output_tokens=5).amount is None
    assert cost(None, input_tokens=10, output_tokens=5).basis == Basis.UNPRICED
    # The provider answered but said nothing of its usage: unknown, not free.
    assert cost(answered=True).amount is None
    assert cost(answered=True).basis == Basis.UNREPORTED
    nothing = cost(None, answered=False)
    assert (nothing.amount, nothing.basis) == (Decimal(0), Basis.NOTHING_USED)


# --- prices through the API -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("input_per_mtok", "-1", "must not be negative"),
        ("output_per_mtok", -0.5, "must not be negative"),
        ("input_per_mtok", "NaN", "finite"),
        ("cached_input_per_mtok", "Infinity", "finite"),
        ("reasoning_per_mtok", "3 dollars", "not a decimal amount"),
        ("input_per_mtok", "0.0000001", "at most 6 decimal places"),
        ("output_per_mtok", None, "is required"),
        ("input_per_mtok", True, "decimal string or a number"),
        ("currency", "dollars", "ISO 4217"),
        ("effective_from", "yesterday", "ISO 8601"),
    ],
)
def test_a_bad_price_is_a_400_naming_the_field_and_nothing_is_stored(
    api: Client, providers: dict[str, Provider], field: str, value: Any, says: str
) -> None:
    body: dict[str, Any] = {"provider": "standin-openai", "model": "answer", **PRICE, field: value}
    response = post_price(api, **body)
    assert response.status_code == 400, response.content
    error = response.json()
    assert error["data"]["field"] == field and says in error["message"], error
    assert not Price.objects.exists()


@pytest.mark.parametrize("when", OUT_OF_RANGE)
def test_a_price_from_outside_1970_to_9000_in_utc_is_a_400_and_nothing_is_stored(
    api: Client, providers: dict[str, Provider], when: str
) -> None:
    """Stored, year 1 at +05:00 became 1 BC: every read of the model's prices failed after."""
    response = post_price(
        api, provider="standin-openai", model="answer", effective_from=when, **PRICE
    )
    assert response.status_code == 400, response.content
    error = response.json()
    assert error["data"]["field"] == "effective_from"
    assert error["data"]["errors"] == [
        {
            "field": "effective_from",
            "message": "must be on or after 1970-01-01T00:00:00Z and before 9000-01-01T00:00:00Z",
        }
    ]
    assert not Price.objects.exists()
    assert api.get("/api/v1/prices").json() == []


def test_prices_at_the_edges_of_the_range_are_stored_and_listed(
    api: Client, providers: dict[str, Provider]
) -> None:
    made = [
        priced(api, "standin-openai", f"answer-{i}", effective_from=when, **PRICE)
        for i, when in enumerate(IN_RANGE)
    ]
    listed = api.get("/api/v1/prices")
    assert listed.status_code == 200, listed.content
    assert sorted(p["effective_from"] for p in listed.json()) == sorted(
        p["effective_from"] for p in made
    )
    assert [datetime.fromisoformat(p["effective_from"]) for p in made] == [
        datetime.fromisoformat(when) for when in IN_RANGE
    ]


@pytest.mark.parametrize("field", ["since", "until"])
def test_a_spend_period_outside_1970_to_9000_in_utc_is_a_400_naming_its_end(
    api: Client, field: str
) -> None:
    for when in OUT_OF_RANGE:
        response = api.get("/api/v1/spend", {field: when})
        assert response.status_code == 400, (when, response.content)
        assert response.json()["data"]["field"] == field
    for when in IN_RANGE:
        assert api.get("/api/v1/spend", {field: when}).status_code == 200


@pytest.mark.parametrize("field", ["since", "until"])
def test_a_spend_instant_with_a_control_character_is_a_400_naming_it(
    api: Client, field: str
) -> None:
    # Python's fromisoformat would read the first as 2026-01-15T08:00:00Z, NUL ignored.
    for when in (
        "2026-01-15T08:00:00Z\x00",
        "2026-01-15T08:00:00+00:00\x00",
        "2026-01-15T08:00:00Z\x85",
    ):
        response = api.get("/api/v1/spend", {field: when})
        assert response.status_code == 400, (when, response.content)
        assert response.json()["data"]["field"] == field


def test_prices_are_for_operators_only_and_refused_before_the_body_is_read(
    providers: dict[str, Provider],
) -> None:
    user = Client(
        headers={"Authorization": f"Bearer {api_token_create(name='u', operator=False)[1]}"}
    )
    for body in (
        {"provider": "standin-openai", "model": "answer", **PRICE},
        {"input_per_mtok": -1},
    ):
        response = post_price(user, **body)
        assert response.status_code == 403, response.content
    assert user.get("/api/v1/prices").status_code == 403
    assert not Price.objects.exists()


def test_a_price_is_listed_as_posted(api: Client, providers: dict[str, Provider]) -> None:
    made = priced(api, "standin-openai", "answer", input_per_mtok=0.1, output_per_mtok="2.50")
    assert (made["input_per_mtok"], made["output_per_mtok"], made["currency"]) == (
        "0.1",
        "2.5",
        "USD",
    )
    assert made["cached_input_per_mtok"] is None
    listed = api.get("/api/v1/prices").json()
    assert [p["id"] for p in listed] == [made["id"]]
    unknown = post_price(api, provider="nope", model="answer", **PRICE)
    assert unknown.status_code == 400 and unknown.json()["data"]["field"] == "provider"
    again = post_price(
        api,
        provider="standin-openai",
        model="answer",
        effective_from=made["effective_from"],  # as the API wrote it: the same instant
        **PRICE,
    )
    assert again.status_code == 409 and again.json()["data"]["field"] == "effective_from"
    # Spend is a sum: every price in one currency.
    euros = post_price(api, provider="standin-openai", model="other", currency="eur", **PRICE)
    assert euros.status_code == 400 and euros.json()["data"]["field"] == "currency"
    assert Price.objects.count() == 1


# --- every endpoint's calls are costed ------------------------------------------------------


@pytest.mark.usefixtures("workers")
def test_a_turns_call_is_costed_and_the_turn_sums_its_calls(api: Client, make_agent: Any) -> None:
    price = priced(api, "standin-openai", "think")
    agent = make_agent(model="think")
    turn = wait_turn(api, submit(api, agent.name, ("alice", "what does it cost?"))["id"])
    assert turn["status"] == "succeeded", turn
    (call,) = turn["calls"]
    row = InferenceCall.objects.get(pk=call["id"])
    assert row.reasoning_tokens, "the think scenario reports reasoning apart"
    assert_costed(row, price)
    assert Decimal(call["cost"]) == row.cost and call["price_id"] == price["id"]
    assert Decimal(turn["cost"]) == row.cost
    assert Decimal(spend_of(api, agent.name)["cost"]) == row.cost


def test_a_complete_call_is_costed_and_counted_in_spend(api: Client, make_agent: Any) -> None:
    price = priced(api, "standin-anthropic", "answer")
    agent = make_agent(provider="anthropic")
    for _ in range(2):
        response = complete(api, agent.name)
        assert response.status_code == 200, response.content
    rows = list(InferenceCall.objects.filter(agent=agent))
    for row in rows:
        assert_costed(row, price)
    assert Decimal(response.json()["call"]["cost"]) == rows[-1].cost
    item = spend_of(api, agent.name)
    assert Decimal(item["cost"]) == sum(r.cost for r in rows if r.cost is not None)
    assert (item["calls"], item["unpriced_calls"]) == (2, 0)
    assert item["input_tokens"] == sum(r.input_tokens or 0 for r in rows)
    assert item["output_tokens"] == sum(r.output_tokens or 0 for r in rows)


def test_a_probe_is_costed(runtime: TurnRuntime, api: Client, make_agent: Any) -> None:
    price = priced(api, "standin-openai", "answer")
    agent = make_agent()
    HistoryRowFactory.create(agent=agent, seq=1, participant="alice", content="hello")
    failed = compile_request(agent, HistoryRow.objects.filter(agent=agent).order_by("seq"))
    turn = TurnFactory.create(agent=agent, status=Turn.Status.RUNNING)
    outcome = asyncio.run(
        probe_send(runtime, turn=turn, failed=failed, ticket=breaker_probe_begin(agent=agent))
    )
    assert outcome.outcome == "answered"
    assert outcome.call_id is not None
    row = InferenceCall.objects.get(pk=outcome.call_id)
    assert row.kind == "probe"
    assert_costed(row, price)
    assert Decimal(spend_of(api, agent.name)["cost"]) == row.cost


def test_a_fallback_call_is_billed_at_the_model_that_served_it(
    api: Client, make_agent: Any
) -> None:
    held = "error:status=429,form=retry-after,wait_ms=7200000"
    alternate = "answer:text=from-the-alternate"
    priced(api, "standin-openai", held, input_per_mtok="1000", output_per_mtok="1000")
    cheap = priced(api, "standin-openai", alternate, input_per_mtok="0.5", output_per_mtok="1.5")
    agent = make_agent(model=held)
    agent.fallbacks = [{"provider": "standin-openai", "model": alternate, "context_window": None}]
    agent.save(update_fields=["fallbacks"])
    response = complete(api, agent.name)
    assert response.status_code == 200, response.content
    refused, served = InferenceCall.objects.filter(agent=agent).order_by("id")
    # The primary's 429 answered nothing: it cost nothing, and says so.
    assert (refused.model, refused.cost, refused.price_id) == (held, Decimal(0), None)
    assert refused.cost_basis == "nothing used"
    assert served.model == alternate
    assert_costed(served, cheap)
    assert Decimal(spend_of(api, alternate, group_by="model")["cost"]) == served.cost


def test_a_new_price_does_not_rewrite_the_past(api: Client, make_agent: Any) -> None:
    old = priced(api, "standin-openai", "answer")
    agent = make_agent()
    assert complete(api, agent.name).status_code == 200
    new = priced(api, "standin-openai", "answer", input_per_mtok="6", output_per_mtok="30")
    assert complete(api, agent.name).status_code == 200
    first, second = InferenceCall.objects.filter(agent=agent).order_by("id")
    assert_costed(first, old)
    assert_costed(second, new)
    # A price from a later instant does not apply to a call sent before it.
    later = (timezone.now() + timedelta(hours=1)).isoformat()
    priced(api, "standin-openai", "answer", input_per_mtok="9", output_per_mtok="9")
    assert (
        post_price(
            api, provider="standin-openai", model="answer", effective_from=later, **PRICE
        ).status_code
        == 201
    )
    assert complete(api, agent.name).status_code == 200
    third = InferenceCall.objects.filter(agent=agent).order_by("id").last()
    assert third is not None and third.price_id is not None
    assert third.price_id not in (old["id"], new["id"])
    assert Price.objects.get(pk=third.price_id).input_per_mtok == Decimal(9)


def test_an_unpriced_model_is_null_never_zero(api: Client, make_agent: Any) -> None:
    agent = make_agent()
    response = complete(api, agent.name)
    assert response.status_code == 200
    assert response.json()["call"]["cost"] is None
    row = InferenceCall.objects.get(agent=agent)
    assert (row.cost, row.price_id, row.cost_basis) == (None, None, "unpriced")
    item = spend_of(api, agent.name)
    assert (item["cost"], item["calls"], item["unpriced_calls"]) == (None, 1, 1)
    assert 'agentops_spend_total{model="answer"' not in scraper().get("/metrics").content.decode()


def test_a_turn_with_an_unpriced_call_has_no_cost(api: Client, make_agent: Any) -> None:
    from interfaces.selectors import turn_out
    from tests.factories import CallFactory

    agent = make_agent()
    turn = TurnFactory.create(agent=agent, status=Turn.Status.SUCCEEDED)
    CallFactory.create(agent=agent, turn=turn, outcome="completed", cost=Decimal("0.01"))
    assert turn_out(turn)["cost"] == "0.01"
    CallFactory.create(agent=agent, turn=turn, outcome="completed", cost=None)
    assert turn_out(turn)["cost"] is None


def test_spend_keeps_to_the_tokens_projects_and_the_period(
    api: Client, providers: dict[str, Provider]
) -> None:
    from tests.factories import CallFactory

    ours, ours_token = api_token_create(name="ours", operator=False, project="ours")
    theirs_row, theirs_token = api_token_create(name="theirs", operator=False, project="theirs")
    mine = AgentFactory.create(provider=providers["openai"], project_id=ours.project_id)
    theirs = AgentFactory.create(provider=providers["openai"], project_id=theirs_row.project_id)
    now = timezone.now()
    CallFactory.create(agent=mine, outcome="completed", cost=Decimal("0.1"), ended_at=now)
    CallFactory.create(agent=theirs, outcome="completed", cost=Decimal("0.2"), ended_at=now)
    CallFactory.create(
        agent=mine, outcome="completed", cost=Decimal("5"), ended_at=now - timedelta(days=2)
    )
    client = Client(headers={"Authorization": f"Bearer {ours_token}"})
    seen = spend(client)["items"]
    assert [(i["key"], i["cost"]) for i in seen] == [(mine.name, "5.1")]
    since = (now - timedelta(days=1)).isoformat()
    assert [i["cost"] for i in spend(client, since=since)["items"]] == ["0.1"]
    by_project = spend(api, group_by="project", since=since)
    assert {i["key"]: i["cost"] for i in by_project["items"]} == {"ours": "0.1", "theirs": "0.2"}
    assert by_project["currency"] == "USD"
    other = Client(headers={"Authorization": f"Bearer {theirs_token}"})
    assert [i["key"] for i in spend(other)["items"]] == [theirs.name]
    bad = client.get("/api/v1/spend", {"group_by": "weather"})
    assert bad.status_code == 400 and "group_by" in bad.json()["message"]
    assert client.get("/api/v1/spend", {"since": "last week"}).json()["data"]["field"] == "since"


def test_metrics_count_spend_by_project_and_model(api: Client, make_agent: Any) -> None:
    price = priced(api, "standin-openai", "answer")
    agent = make_agent()
    assert complete(api, agent.name).status_code == 200
    row = InferenceCall.objects.get(agent=agent)
    assert_costed(row, price)
    text = scraper().get("/metrics").content.decode()
    line = f'agentops_spend_total{{model="answer",project="{agent.project.name}"}} '
    (found,) = [ln for ln in text.splitlines() if ln.startswith(line)]
    assert float(found.removeprefix(line)) == pytest.approx(float(row.cost or 0))


# --- the drop-ins ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    yield from asgi_server("spend", {})


def dropin_row(agent: Agent) -> InferenceCall:
    row: InferenceCall = wait_for(
        lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).first(),
        what="the call's row",
    )
    return row


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_completions_call_is_costed(
    api: Client, server: str, user_token: str, make_agent: Any, stream: bool
) -> None:
    price = priced(api, "standin-openai", "answer")
    agent = make_agent()
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0, timeout=20)
    messages: Any = [{"role": "user", "content": "hi"}]
    if stream:
        chunks = client.chat.completions.create(
            model=agent.name,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        list(chunks)
    else:
        client.chat.completions.create(model=agent.name, messages=messages)
    row = dropin_row(agent)
    assert_costed(row, price)
    item = spend_of(api, agent.name)
    assert (Decimal(item["cost"]), item["unpriced_calls"]) == (row.cost, 0)


def test_a_stream_whose_client_asked_no_usage_is_unknown_never_free(
    api: Client, server: str, user_token: str, make_agent: Any
) -> None:
    priced(api, "standin-openai", "answer")
    agent = make_agent()
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0, timeout=20)
    messages: Any = [{"role": "user", "content": "hi"}]
    list(client.chat.completions.create(model=agent.name, messages=messages, stream=True))
    row = dropin_row(agent)
    assert (row.input_tokens, row.cost, row.cost_basis) == (None, None, "usage unreported")
    item = spend_of(api, agent.name)
    assert (item["cost"], item["unpriced_calls"]) == (None, 1)


def test_a_messages_call_is_costed(
    api: Client, server: str, user_token: str, make_agent: Any
) -> None:
    price = priced(api, "standin-anthropic", "answer")
    agent = make_agent(provider="anthropic")
    client = anthropic.Anthropic(base_url=server, api_key=user_token, max_retries=0, timeout=20)
    client.messages.create(
        model=agent.name, max_tokens=100, messages=[{"role": "user", "content": "hi"}]
    )
    row = dropin_row(agent)
    assert_costed(row, price)
    assert Decimal(spend_of(api, agent.name)["cost"]) == row.cost


def test_a_messages_call_with_cache_reads_and_writes_is_costed_part_by_part(
    api: Client, server: str, user_token: str, make_agent: Any
) -> None:
    model = "answer:cache_read=4,cache_write=6"
    price = priced(api, "standin-anthropic", model, **PRICE, cache_write_per_mtok="3.75")
    assert price["cache_write_per_mtok"] == "3.75"
    agent = make_agent(provider="anthropic", model=model)
    client = anthropic.Anthropic(base_url=server, api_key=user_token, max_retries=0, timeout=20)
    client.messages.create(
        model=agent.name,
        max_tokens=100,
        messages=[{"role": "user", "content": "a question long enough to have cached parts"}],
    )
    row = dropin_row(agent)
    assert (row.cached_input_tokens, row.cache_write_tokens) == (4, 6)
    assert row.input_tokens is not None and row.input_tokens > 10
    assert_costed(row, price)


def test_a_responses_call_is_costed(
    api: Client, server: str, user_token: str, standin: str
) -> None:
    provider = ProviderFactory.create(
        name="standin-responses", kind="openai-responses", base_url=f"{standin}/v1"
    )
    price = priced(api, "standin-responses", "think")
    agent = AgentFactory.create(provider=provider, model="think")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0, timeout=20)
    client.responses.create(model=agent.name, input="hi")
    row = dropin_row(agent)
    assert row.reasoning_tokens
    assert_costed(row, price)
    assert Decimal(spend_of(api, "think", group_by="model")["cost"]) == row.cost


# --- the admin ------------------------------------------------------------------------------


def test_the_admin_shows_costs_on_calls_and_agents_and_adds_prices(
    providers: dict[str, Provider],
) -> None:
    from django.contrib.auth.models import User

    from tests.factories import CallFactory

    agent = AgentFactory.create(provider=providers["openai"], name="costly")
    CallFactory.create(agent=agent, outcome="completed", cost=Decimal("0.00125"))
    CallFactory.create(agent=agent, outcome="completed", cost=Decimal("1.5"))
    CallFactory.create(agent=agent, outcome="completed", cost=None, cost_basis="unpriced")
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    calls = client.get("/admin/inference/inferencecall/").content.decode()
    assert "0.00125" in calls and "unpriced" in calls
    agents = client.get("/admin/agentops/agent/").content.decode()
    assert "1.50125 (+1 unpriced)" in agents

    def add(input_per_mtok: str, day: str, time: str) -> Any:
        return client.post(
            "/admin/agentops/price/add/",
            {
                "provider": providers["openai"].pk,
                "model": "answer",
                "input_per_mtok": input_per_mtok,
                "output_per_mtok": "2",
                "currency": "USD",
                "effective_from_0": day,
                "effective_from_1": time,
            },
        )

    added = add("-1", "2026-01-01", "00:00:00")
    assert added.status_code == 200 and not Price.objects.exists()  # the form, with its error
    too_early = add("1", "1969-12-31", "23:59:59")
    assert too_early.status_code == 200 and not Price.objects.exists()
    assert "must be on or after 1970-01-01T00:00:00Z" in too_early.content.decode()
    added = add("1", "2026-01-01", "00:00:00")
    assert added.status_code == 302, added.content.decode()[-2000:]
    price = Price.objects.get()
    page = client.get(f"/admin/agentops/price/{price.pk}/change/").content.decode()
    assert 'name="input_per_mtok"' not in page  # a saved price is read-only


def test_a_cost_past_the_column_is_unknown_and_the_usage_is_kept(
    runtime: TurnRuntime, api: Client, make_agent: Any
) -> None:
    from calls.records import call_cost_fields

    made = priced(api, "standin-openai", "answer", input_per_mtok="999999", output_per_mtok="0")
    fields = {
        "sent_at": timezone.now(),
        "outcome": "completed",
        "input_tokens": 2**62,
        "output_tokens": 1,
    }
    provider = Provider.objects.get(name="standin-openai")
    got = call_cost_fields(runtime.prices, provider_id=provider.pk, model="answer", fields=fields)
    assert got == {"cost": None, "price_id": made["id"], "cost_basis": "out of range"}
    fields["input_tokens"] = 1_000_000
    got = call_cost_fields(runtime.prices, provider_id=provider.pk, model="answer", fields=fields)
    assert (got["cost"], got["cost_basis"]) == (Decimal(999999), "priced")


def test_a_replayed_idempotent_request_is_paid_once(
    api: Client, server: str, user_token: str, make_agent: Any
) -> None:
    price = priced(api, "standin-openai", "answer")
    agent = make_agent()
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0, timeout=20)
    messages: Any = [{"role": "user", "content": "hi"}]
    for _ in range(2):
        client.chat.completions.create(
            model=agent.name, messages=messages, extra_headers={"Idempotency-Key": "spend-once"}
        )
    row = dropin_row(agent)
    assert_costed(row, price)
    item = spend_of(api, agent.name)
    assert (item["calls"], Decimal(item["cost"])) == (1, row.cost)
