"""API.md's Waits endpoints (operator only), mounted at ``/waits``: thin over ``waits``.

``POST /waits/release`` reads its body as raw JSON so that a number, list, object or null
``model`` reaches the release service's validation and is refused with a 400 naming ``model``,
instead of being coerced or reported as a schema error.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from agentops.exceptions import bad_field
from agentops.validation import Line, Text
from interfaces.api.auth import OperatorTokenAuth, require_operator
from interfaces.api.body import (
    check_fields,
    check_instant,
    json_body,
    optional_line,
    optional_text,
)
from interfaces.api.schemas import ErrorOut
from turns.holds import next_call_at
from turns.queue import held_turns_wake  # an interface may wake turns
from waits.clock import clock_ms
from waits.limits import limit_release, operator_hold, operator_lift
from waits.selectors import binding_waits, journal_entries, wait_listed
from waits.services import RELEASE_REASON_LIMIT, REQUESTER_LIMIT, wait_release

router = Router(tags=["waits"], auth=OperatorTokenAuth())  # operator only, checked first

ERRORS: dict[int, type] = {
    400: ErrorOut,
    401: ErrorOut,
    403: ErrorOut,
    404: ErrorOut,
    413: ErrorOut,
}
AgentName = Annotated[Line, Field(max_length=100)]
RELEASE_SHAPE = "{agent, model?, requester?, reason?} or {provider, model?, reason}"
RELEASE_FIELDS = ("agent", "provider", "model", "requester", "reason")
HOLD_SHAPE = "{provider, model?, agent?, until?, reason}"
HOLD_FIELDS = ("provider", "model", "agent", "until", "reason")
ModelName = Annotated[Line, Field(max_length=200)]


class WaitOut(Schema):
    agent: str = Field(description='An agent\'s name, or "*": every agent on ``provider``.')
    model: str
    # The provider the wait binds on; null: the agent's own (architecture §6.11).
    provider: str | None = None
    scope: Literal["agent", "model", "provider"] = "agent"
    id: str | None = Field(None, description="An operator's hold: its id, to lift it with.")
    until: datetime | None
    reason: str
    set_at: datetime | None
    source: Literal["recorded", "pending", "unreadable", "operator"]


class WaitsOut(Schema):
    journal_readable: bool
    waits: list[WaitOut]


class WaitsFilter(Schema):
    agent: AgentName | None = None
    model: ModelName | None = None


class ReleaseIn(Schema):
    """For the OpenAPI document only: the handler validates the raw body itself."""

    agent: Annotated[Line, Field(min_length=1, max_length=100)]
    model: (
        Annotated[
            Line,
            Field(
                min_length=1,
                max_length=200,
                description='A model name, or "*" (or omitted) for every model.',
            ),
        ]
        | None
    ) = None
    requester: (
        Annotated[
            Line,
            Field(
                max_length=200,
                description=(
                    "Who asked for the release (free text, kept in the audit entry's data)."
                ),
            ),
        ]
        | None
    ) = None
    reason: Annotated[Text, Field(max_length=1000)] | None = None


class ReceiptOut(Schema):
    agent: str | None = Field(None, description="The agent whose wait was lifted.")
    provider: str | None = Field(
        None, description="A provider's release: the provider whose scoped wait was lifted."
    )
    scope: Literal["model", "provider"] | None = None
    model: str
    until: datetime | None
    release: Literal["recorded", "pending", "in-process override"]
    next_call_at: datetime | None = Field(
        None,
        description=(
            "When the next call for (agent, model) may go: "
            "now, or after the pacing a lifted 429 still keeps."
        ),
    )


class ReleaseOut(Schema):
    receipts: list[ReceiptOut]


class JournalFilter(Schema):
    agent: AgentName | None = None
    limit: int = Field(100, ge=1, le=1000)


class JournalEntryOut(Schema):
    id: int
    kind: str
    agent: str
    model: str
    until: datetime | None
    reason: str
    by: str
    at: datetime
    until_ms: int | None
    act_id: str
    problem: str | None


@router.get("", response={200: WaitsOut, **ERRORS})
def waits_list(request: HttpRequest, filters: Query[WaitsFilter]) -> dict[str, Any]:
    require_operator(request)
    readable, waits = binding_waits(
        agent=filters.agent or None, model=filters.model or None, now_ms=clock_ms()
    )
    return {"journal_readable": readable, "waits": waits}


@router.post(
    "/release",
    response={200: ReleaseOut, **ERRORS},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ReleaseIn.model_json_schema()}},
        }
    },
)
def waits_release(request: HttpRequest) -> dict[str, Any]:
    token = require_operator(request)
    body = json_body(request, shape=RELEASE_SHAPE)
    check_fields(body, RELEASE_FIELDS, shape=f"a release {RELEASE_SHAPE}")
    if "provider" in body:
        return _provider_release(body, by=f"api:{token.name}")
    if "agent" not in body:
        raise bad_field("agent", "is required (or provider, to release a provider's limits)")
    if "model" in body and body["model"] is None:
        raise bad_field(
            "model",
            "must be a non-empty string, not null "
            '(omit model, or send "*", to release every model)',
        )
    # What could not be stored, or would mislead a reader, is refused before the act exists.
    optional_line(body, "requester", limit=REQUESTER_LIMIT)
    optional_text(body, "reason", limit=RELEASE_REASON_LIMIT)
    # The act is the token's (api:<token name>); the free-text requester is kept as data.
    receipts = wait_release(
        agent=body["agent"],
        model=body.get("model"),
        requester=body.get("requester"),
        reason=body.get("reason"),
        via="api",
        caller=token.name,
    )
    held_turns_wake(agent=str(body["agent"]), model=body.get("model"), by=f"api:{token.name}")
    return {
        "receipts": [
            {**r.out(), "next_call_at": next_call_at(agent=r.agent, model=r.model)}
            for r in receipts
        ]
    }


def _provider_release(body: dict[str, Any], *, by: str) -> dict[str, Any]:
    """A provider's scoped waits released (architecture.md §6.12): every agent held by them
    is woken; an agent's own waits and operators' holds stay."""
    if "agent" in body or "requester" in body:
        name = "agent" if "agent" in body else "requester"
        raise bad_field(name, "a provider's release names provider, model? and reason only")
    if "model" in body and body["model"] is None:
        raise bad_field(
            "model", 'must be a non-empty string (omit it, or send "*", for every model)'
        )
    optional_text(body, "reason", limit=RELEASE_REASON_LIMIT)
    receipts = limit_release(
        provider=body["provider"], model=body.get("model"), reason=body.get("reason"), by=by
    )
    held_turns_wake(provider=str(body["provider"]), model=body.get("model"), by=by)
    return {"receipts": [r.as_json() for r in receipts]}


class HoldIn(Schema):
    """For the OpenAPI document only: the handler validates the raw body itself."""

    provider: Annotated[Line, Field(min_length=1, max_length=100)]
    model: Annotated[Line, Field(min_length=1, max_length=200)] | None = None
    agent: Annotated[Line, Field(min_length=1, max_length=100)] | None = None
    until: datetime | None = None
    reason: Annotated[Text, Field(min_length=1, max_length=1000)]


@router.post(
    "/holds",
    response={201: WaitOut, **ERRORS},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": HoldIn.model_json_schema()}},
        }
    },
)
def waits_hold(request: HttpRequest) -> tuple[int, dict[str, Any]]:
    """An operator's own hold (architecture.md §6.12): no call at that scope until it ends or
    is lifted (``DELETE /waits/holds/{id}``); no release of waits lifts it."""
    token = require_operator(request)
    body = json_body(request, shape=HOLD_SHAPE)
    check_fields(body, HOLD_FIELDS, shape=f"a hold {HOLD_SHAPE}")
    if "provider" not in body:
        raise bad_field("provider", "is required")
    optional_text(body, "reason", limit=RELEASE_REASON_LIMIT)
    until = body.get("until")
    if until is not None:
        if not isinstance(until, str):
            raise bad_field("until", "must be an ISO 8601 instant (or omitted: until lifted)")
        instant = check_instant("until", until)
        until = instant.timestamp() * 1000 if instant is not None else None
    hold = operator_hold(
        provider=body["provider"],
        model=body.get("model"),
        agent=body.get("agent"),
        until=until,
        reason=body.get("reason"),
        by=f"api:{token.name}",
    )
    return 201, wait_listed(hold)


@router.delete("/holds/{hold_id}", response={200: WaitOut, **ERRORS})
def waits_lift(request: HttpRequest, hold_id: str) -> dict[str, Any]:
    token = require_operator(request)
    reason = request.GET.get("reason", "")
    hold = operator_lift(ref=hold_id[:64], reason=reason, by=f"api:{token.name}")
    agent = None if hold.agent == "*" else hold.agent
    held_turns_wake(agent=agent, provider="" if agent else hold.provider, by=f"api:{token.name}")
    return wait_listed(hold)


@router.get("/journal", response={200: list[JournalEntryOut], **ERRORS})
def waits_journal(request: HttpRequest, filters: Query[JournalFilter]) -> list[dict[str, Any]]:
    require_operator(request)
    return journal_entries(agent=filters.agent or None, limit=filters.limit)
