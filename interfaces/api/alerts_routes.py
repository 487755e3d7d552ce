"""API.md's alerts endpoints (operator only), mounted at ``/alerts``: list and acknowledge."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.http import HttpRequest
from django.utils import timezone
from ninja import Query, Router, Schema

from agentops.alerts import alert_acknowledge
from agentops.models import Alert
from agentops.selectors import alert_out
from interfaces.api.auth import OperatorTokenAuth, require_operator
from interfaces.api.body import check_instant, checked_text
from interfaces.api.schemas import ERRORS

router = Router(tags=["alerts"], auth=OperatorTokenAuth())  # operator only, checked first


ALERTS_LIMIT = 500  # newest first; older alerts stay in the admin and failures.log


class AlertOut(Schema):
    id: int
    kind: str
    agent: str
    model: str
    verdict: str | None
    message: str
    data: dict[str, Any]
    created_at: datetime
    acknowledged_at: datetime | None


class AlertsFilter(Schema):
    # Plain strings, checked by the handler: an empty value means "any", and ``since`` must be
    # ISO 8601 with an offset (pydantic would also take a bare Unix number or a local time).
    kind: str | None = None
    agent: str | None = None
    since: str | None = None


def _check_label(field: str, value: str | None, limit: int) -> str | None:
    # A line's rules (PostgreSQL refuses a NUL in a query parameter; no stored label holds any
    # of what they refuse).
    return checked_text(field, value, limit=limit, line=True) if value else None


@router.get("", response={200: list[AlertOut], **ERRORS})
def alerts_list(request: HttpRequest, filters: Query[AlertsFilter]) -> list[dict[str, Any]]:
    require_operator(request)
    kind = _check_label("kind", filters.kind, Alert._meta.get_field("kind").max_length or 0)
    agent = _check_label("agent", filters.agent, Alert._meta.get_field("agent").max_length or 0)
    since = check_instant("since", filters.since)
    alerts = Alert.objects.order_by("-created_at", "-id")
    if kind is not None:
        alerts = alerts.filter(kind=kind)
    if agent is not None:
        alerts = alerts.filter(agent=agent)
    if since is not None:
        alerts = alerts.filter(created_at__gte=since)
    return [alert_out(a) for a in alerts[:ALERTS_LIMIT]]


@router.post("/{alert_id}/acknowledge", response={200: AlertOut, **ERRORS})
def alerts_acknowledge(request: HttpRequest, alert_id: int) -> dict[str, Any]:
    token = require_operator(request)
    return alert_out(
        alert_acknowledge(alert_id=alert_id, actor=f"api:{token.name}", now=timezone.now())
    )
