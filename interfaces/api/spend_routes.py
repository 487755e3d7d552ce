"""API.md's prices (operator only) and spend endpoints, mounted at the API root."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.http import HttpRequest
from ninja import Query, Router, Schema, Status
from pydantic import BaseModel

from agentops.exceptions import bad_field
from agentops.models import Price
from agentops.prices import PRICE_FIELDS, price_amount, price_create, price_out
from interfaces.api.alerts_routes import check_instant
from interfaces.api.auth import require_operator
from interfaces.api.body import checked_text, json_body
from interfaces.api.schemas import ERRORS
from interfaces.spend import spend_out

router = Router()


PRICE_SHAPE = (
    "{provider, model, input_per_mtok, output_per_mtok, cached_input_per_mtok?, "
    "reasoning_per_mtok?, currency?, effective_from?}"
)
PRICE_KEYS = {"provider", "model", *PRICE_FIELDS, "currency", "effective_from"}


class PriceIn(Schema):
    """The body of ``POST /prices`` (read by hand: an amount may be a string or a number)."""

    provider: str
    model: str
    input_per_mtok: str | float
    output_per_mtok: str | float
    cached_input_per_mtok: str | float | None = None
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
    group_by: Literal["agent", "project", "model"] = "agent"
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
    unknown = sorted(set(body) - PRICE_KEYS)
    if unknown:
        raise bad_field(unknown[0], f"is not a field of a price {PRICE_SHAPE}")
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
