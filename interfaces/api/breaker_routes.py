"""API.md's breaker endpoints (operator only): the breaker of one agent, and restoring a row it
(or anyone) set aside. Mounted at the API root: ``api.add_router("", router)``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Router
from pydantic import BaseModel

from agentops.exceptions import NotFound
from agentops.selectors import agent_for, history_row_out, id_valid
from breaker.selectors import breaker_out
from breaker.services import RESTORE_REASON_LIMIT, history_row_restore
from interfaces.api.auth import OperatorTokenAuth, require_operator
from interfaces.api.body import check_fields, json_body, optional_line, optional_text
from interfaces.api.schemas import ERRORS, HistoryRowOut, RestoreIn

router = Router(tags=["breaker"], auth=OperatorTokenAuth())  # operator only, checked first


class ProbeOut(BaseModel):
    status: str
    sent_at: datetime | None
    verdict: str | None


class BreakerOut(BaseModel):
    streak: int
    threshold: int
    sheds_this_run: int
    shed_cap: int
    probe: ProbeOut | None
    set_aside: list[HistoryRowOut]


@router.get("/agents/{name}/breaker", response={200: BreakerOut, **ERRORS})
def agent_breaker(request: HttpRequest, name: str) -> dict[str, Any]:
    token = require_operator(request)
    return breaker_out(agent=agent_for(token=token, name=name))


@router.post(
    "/agents/{name}/history/{row_id}/restore",
    response={200: HistoryRowOut, **ERRORS},
    openapi_extra={
        "requestBody": {
            "required": False,
            "content": {"application/json": {"schema": RestoreIn.model_json_schema()}},
        }
    },
)
def history_restore(request: HttpRequest, name: str, row_id: int) -> dict[str, Any]:
    # The body is read raw so a non-string requester is a 400 naming it, not a 422.
    token = require_operator(request)
    agent = agent_for(token=token, name=name)
    if not id_valid(row_id):
        raise NotFound(
            f"row_id: agent {name!r} has no history row {row_id}", data={"field": "row_id"}
        )
    body = json_body(request, shape="{requester?, reason?}", required=False)
    check_fields(body, ("requester", "reason"), shape="a restore {requester?, reason?}")
    requester = optional_line(body, "requester", limit=1000)
    reason = optional_text(body, "reason", limit=RESTORE_REASON_LIMIT)
    row = history_row_restore(
        agent_name=agent.name,
        row_id=row_id,
        actor=f"api:{token.name}",
        requester=requester,
        reason=reason,
    )
    return history_row_out(row)
