"""API.md's prices (operator only) and spend endpoints, mounted at the API root."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest
from django.utils import timezone
from ninja import Query, Router, Schema, Status
from pydantic import BaseModel

from agentops.budget_api import budget_out, check_budget
from agentops.exceptions import NotFound, bad_field
from agentops.models import Agent, Budget, Price, Project
from agentops.prices import PRICE_FIELDS, price_amount, price_create, price_out
from agentops.validation import text_problem
from interfaces.api.auth import require_operator
from interfaces.api.body import check_fields, check_instant, checked_text, json_body
from interfaces.api.schemas import ERRORS
from interfaces.budgets import owner_budget_remove, owner_budget_set
from interfaces.edge import runtime_of
from interfaces.spend import spend_out

router = Router()


PRICE_SHAPE = (
    "{provider, model, input_per_mtok, output_per_mtok, cached_input_per_mtok?, "
    "cache_write_per_mtok?, reasoning_per_mtok?, currency?, effective_from?}"
)
PRICE_KEYS = {"provider", "model", *PRICE_FIELDS, "currency", "effective_from"}


class PriceIn(Schema):
    """The body of ``POST /prices`` (read by hand: an amount may be a string or a number)."""

    provider: str
    model: str
    input_per_mtok: str | float
    output_per_mtok: str | float
    cached_input_per_mtok: str | float | None = None
    cache_write_per_mtok: str | float | None = None
    reasoning_per_mtok: str | float | None = None
    currency: str | None = "USD"
    effective_from: datetime | None = None


class PriceOut(BaseModel):
    id: int
    provider: str
    model: str
    input_per_mtok: str
    output_per_mtok: str
    cached_input_per_mtok: str | None
    cache_write_per_mtok: str | None
    reasoning_per_mtok: str | None
    currency: str
    effective_from: datetime
    created_at: datetime


class SpendItem(BaseModel):
    key: str
    cost: str | None
    calls: int
    unpriced_calls: int
    input_tokens: int
    output_tokens: int


class SpendOut(BaseModel):
    items: list[SpendItem]
    currency: str


class SpendFilter(Schema):
    group_by: Literal["agent", "project", "model", "day"] = "agent"
    since: str | None = None
    until: str | None = None


def _text(body: dict[str, Any], field: str, *, limit: int) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value:
        raise bad_field(field, "must be a non-empty string")
    return checked_text(field, value, limit=limit, line=True)


@router.post(
    "/prices",
    response={201: PriceOut, **ERRORS},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": PriceIn.model_json_schema()}},
        }
    },
)
def prices_create(request: HttpRequest) -> Status:
    require_operator(request)  # before the body is read: a 403 says nothing of its fields
    body = json_body(request, shape=PRICE_SHAPE)
    check_fields(body, PRICE_KEYS, shape=f"a price {PRICE_SHAPE}")
    provider = _text(body, "provider", limit=100)
    model = _text(body, "model", limit=Price._meta.get_field("model").max_length or 200)
    amounts = {
        f: price_amount(f, body.get(f), required=f in ("input_per_mtok", "output_per_mtok"))
        for f in PRICE_FIELDS
    }
    currency = body.get("currency")
    if currency is None:
        currency = "USD"
    if not isinstance(currency, str) or len(currency) != 3 or not currency.isascii():
        raise bad_field("currency", 'must be a three-letter ISO 4217 code (e.g. "USD")')
    currency = currency.upper()
    if not currency.isalpha():
        raise bad_field("currency", 'must be a three-letter ISO 4217 code (e.g. "USD")')
    other = Price.objects.exclude(currency=currency).values_list("currency", flat=True).first()
    if other is not None:
        # Spend sums every call's cost: one currency for all prices keeps the sum a sum.
        raise bad_field("currency", f"must be {other}, the currency of the prices already set")
    when = body.get("effective_from")
    if when is not None and not isinstance(when, str):
        raise bad_field("effective_from", "must be an ISO 8601 instant")
    price = price_create(
        runtime_of(request).prices,
        provider=provider,
        model=model,
        amounts=amounts,
        currency=currency,
        effective_from=check_instant("effective_from", when),
    )
    return Status(201, price_out(price))


@router.get("/prices", response={200: list[PriceOut], **ERRORS})
def prices_list(request: HttpRequest) -> list[dict[str, Any]]:
    require_operator(request)
    return [price_out(p) for p in Price.objects.select_related("provider")]


@router.get("/spend", response={200: SpendOut, **ERRORS})
def spend(request: HttpRequest, filters: Query[SpendFilter]) -> dict[str, Any]:
    since = check_instant("since", filters.since)
    until = check_instant("until", filters.until)
    return spend_out(
        token=request.auth,  # type: ignore[attr-defined]
        group_by=filters.group_by,
        since=since,
        until=until,
    )


# --- budgets (architecture.md §18) -----------------------------------------------------------


class BudgetOut(BaseModel):
    amount: str
    period: str
    warn_at: float
    spent: str
    reserved: str
    left: str
    refused_estimate: str | None
    held: bool
    resets_at: datetime


BUDGET_SHAPE = '{amount, period: "day"|"week"|"month", warn_at?}'


def _owner(kind: str, name: str) -> Agent | Project:
    model: type[Agent] | type[Project] = Agent if kind == "agent" else Project
    # A name that could not be stored (NUL, a control) names nothing: 404, not the database's
    # refusal of the query as a 500.
    if text_problem(name, line=True) is not None:
        raise NotFound(f"no {kind} named {name!r}", data={"field": "name"})
    found = model.objects.filter(name=name).first()
    if found is None or (isinstance(found, Agent) and found.disposed_at is not None):
        raise NotFound(f"no {kind} named {name!r}", data={"field": "name"})
    return found


def _budget_put(request: HttpRequest, kind: str, name: str) -> dict[str, Any]:
    require_operator(request)  # before the body is read: a 403 says nothing of its fields
    owner = _owner(kind, name)
    amount, period, warn_at = check_budget(json_body(request, shape=BUDGET_SHAPE))
    now = timezone.now()
    budget = owner_budget_set(owner=owner, amount=amount, period=period, warn_at=warn_at, now=now)
    return budget_out(budget, now)


def _budget_get(request: HttpRequest, kind: str, name: str) -> dict[str, Any]:
    require_operator(request)
    owner = _owner(kind, name)
    budget = Budget.objects.filter(**{kind: owner}).first()
    if budget is None:
        raise NotFound(f"{kind} {name!r} has no budget", data={"field": "name"})
    return budget_out(budget, timezone.now())


def _budget_delete(request: HttpRequest, kind: str, name: str) -> Status:
    require_operator(request)
    owner = _owner(kind, name)
    if not owner_budget_remove(owner=owner):
        raise NotFound(f"{kind} {name!r} has no budget", data={"field": "name"})
    return Status(204, None)


@router.put("/agents/{name}/budget", response={200: BudgetOut, **ERRORS}, tags=["budgets"])
def agent_budget_put(request: HttpRequest, name: str) -> dict[str, Any]:
    return _budget_put(request, "agent", name)


@router.get("/agents/{name}/budget", response={200: BudgetOut, **ERRORS}, tags=["budgets"])
def agent_budget_get(request: HttpRequest, name: str) -> dict[str, Any]:
    return _budget_get(request, "agent", name)


@router.delete("/agents/{name}/budget", response={204: None, **ERRORS}, tags=["budgets"])
def agent_budget_delete(request: HttpRequest, name: str) -> Status:
    return _budget_delete(request, "agent", name)


@router.put("/projects/{name}/budget", response={200: BudgetOut, **ERRORS}, tags=["budgets"])
def project_budget_put(request: HttpRequest, name: str) -> dict[str, Any]:
    return _budget_put(request, "project", name)


@router.get("/projects/{name}/budget", response={200: BudgetOut, **ERRORS}, tags=["budgets"])
def project_budget_get(request: HttpRequest, name: str) -> dict[str, Any]:
    return _budget_get(request, "project", name)


@router.delete("/projects/{name}/budget", response={204: None, **ERRORS}, tags=["budgets"])
def project_budget_delete(request: HttpRequest, name: str) -> Status:
    return _budget_delete(request, "project", name)
