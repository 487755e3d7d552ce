"""API.md's breaker endpoints (operator only): the breaker of one agent, and restoring a row it
(or anyone) set aside. Mounted at the API root: ``api.add_router("", router)``."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.http import HttpRequest
from ninja import Router
from pydantic import BaseModel

from agentops.exceptions import bad_field
from agentops.selectors import agent_get, history_row_out
from breaker.selectors import breaker_out
from breaker.services import history_row_restore

from .auth import require_operator
from .schemas import ErrorOut, HistoryRowOut, RestoreIn

router = Router(tags=["breaker"])

ERRORS: dict[int, type] = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 409: ErrorOut}


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
    require_operator(request)
    return breaker_out(agent=agent_get(name=name))


@router.post(
    "/agents/{name}/history/{row_id}/restore",
    response={200: HistoryRowOut, **ERRORS},
    openapi_extra={"requestBody": {"required": False, "content": {"application/json": {"schema": RestoreIn.model_json_schema()}}}},
)
def history_restore(request: HttpRequest, name: str, row_id: int) -> dict[str, Any]:
    # The body is read raw so a non-string requester is a 400 naming it, not a 422.
    token = require_operator(request)
    try:
        body = json.loads(request.body) if request.body else {}
    except (ValueError, UnicodeDecodeError):
        raise bad_field("body", "not valid JSON") from None
    if not isinstance(body, dict):
        raise bad_field("body", "must be a JSON object {requester?}")
    row = history_row_restore(agent_name=name, row_id=row_id, actor=f"api:{token.name}", requester=body.get("requester"))
    return history_row_out(row)
