"""API.md's alerts endpoints over HTTP: operator only, filters, 400 naming ``since``, acknowledge
once (then 409) with its audit entry.

The alerts router is mounted on a test API in this module, so these tests do not depend on how
the main API is wired."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import path
from ninja import NinjaAPI

from agentops.alerts import alert_raise
from agentops.models import Alert, AuditEntry
from interfaces.api import errors
from interfaces.api.alerts_routes import ALERTS_LIMIT, router
from interfaces.api.auth import TokenAuth

api = NinjaAPI(
    title="agentops alerts (tests)",
    version="1",
    auth=TokenAuth(),
    urls_namespace="api-v1-alerts-tests",
)
errors.install(api)
api.add_router("/alerts", router)
urlpatterns = [path("api/v1/", api.urls)]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]

T0 = datetime(2026, 1, 15, 8, 0, tzinfo=UTC)


def raised(*, kind: str, agent: str, at: datetime, model: str = "m1", verdict: str = "") -> Alert:
    """An alert raised through the service, then dated ``at``."""
    alert = alert_raise(
        kind=kind,
        agent=agent,
        model=model,
        verdict=verdict,
        message=f"{kind} for {agent}",
        data={"n": 1},
    )
    Alert.objects.filter(pk=alert.pk).update(created_at=at)
    return alert


@pytest.fixture
def alerts() -> dict[str, Alert]:
    return {
        "ada-wait": raised(kind="provider-wait", agent="ada", at=T0),
        "bob-wait": raised(kind="provider-wait", agent="bob", at=T0 + timedelta(minutes=1)),
        "ada-down": raised(
            kind="hard-down", agent="ada", at=T0 + timedelta(minutes=2), verdict="history"
        ),
    }


def ids(response: Any) -> list[int]:
    assert response.status_code == 200, response.content
    return [a["id"] for a in response.json()]


def acknowledge(client: Client, alert_id: int | str) -> Any:
    return client.post(f"/api/v1/alerts/{alert_id}/acknowledge")


# --- the list --------------------------------------------------------------------------------


def test_alerts_are_listed_newest_first_with_the_fields_of_the_contract(
    api: Client, alerts: dict[str, Alert]
) -> None:
    body = api.get("/api/v1/alerts").json()
    assert [a["id"] for a in body] == [alerts[k].pk for k in ("ada-down", "bob-wait", "ada-wait")]
    assert body[0] == {
        "id": alerts["ada-down"].pk,
        "kind": "hard-down",
        "agent": "ada",
        "model": "m1",
        "verdict": "history",
        "message": "hard-down for ada",
        "data": {"n": 1},
        "created_at": "2026-01-15T08:02:00Z",
        "acknowledged_at": None,
    }
    assert body[1]["verdict"] is None  # no verdict is null, not ""


FILTERS = [
    ("kind=provider-wait", ["bob-wait", "ada-wait"]),
    ("agent=ada", ["ada-down", "ada-wait"]),
    ("kind=provider-wait&agent=ada", ["ada-wait"]),
    ("since=2026-01-15T08:01:00Z", ["ada-down", "bob-wait"]),  # since is inclusive
    (
        "since=2026-01-15T09:01:00%2B01:00",
        ["ada-down", "bob-wait"],
    ),  # the same instant, another offset
    ("since=2026-01-15T08:01:00.001Z", ["ada-down"]),
    ("agent=ada&since=2026-01-15T08:00:00Z", ["ada-down", "ada-wait"]),
    ("kind=hard-down&agent=bob", []),
    ("kind=&agent=&since=", ["ada-down", "bob-wait", "ada-wait"]),  # empty is "any"
]


@pytest.mark.parametrize(("query", "expected"), FILTERS)
def test_alerts_are_filtered_by_kind_agent_and_since(
    api: Client, alerts: dict[str, Alert], query: str, expected: list[str]
) -> None:
    assert ids(api.get(f"/api/v1/alerts?{query}")) == [alerts[k].pk for k in expected]


@pytest.mark.parametrize(
    "since",
    [
        "yesterday",
        "1768464000",
        "2026-13-01T00:00:00Z",
        "2026-01-15T08:00:00",
        "2026-01-15",
        "2026-01-15T08:00:00Zjunk",
    ],
)
def test_a_since_that_is_not_an_iso_8601_instant_is_a_400_naming_since(
    api: Client, alerts: dict[str, Alert], since: str
) -> None:
    response = api.get("/api/v1/alerts", {"since": since})
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "bad_request" and body["data"]["field"] == "since"
    assert body["message"].startswith("since: ")


# Instants both Python and PostgreSQL hold in any zone (API.md: 1970 up to 9000, in UTC).
OUT_OF_RANGE = [
    "0001-01-01T00:00:00+05:00",  # 1 BC once in UTC
    "9999-12-31T23:59:59-14:00",  # the year 10000 once in UTC
    "1969-12-31T23:59:59.999999Z",
    "1970-01-01T04:59:59+05:00",  # 1969 in UTC
    "9000-01-01T00:00:00Z",
    "8999-12-31T23:00:00-01:00",  # 9000 in UTC
]
IN_RANGE = ["1970-01-01T00:00:00Z", "1970-01-01T05:00:00+05:00", "8999-12-31T23:59:59.999Z"]


@pytest.mark.parametrize("since", OUT_OF_RANGE)
def test_a_since_outside_1970_to_9000_in_utc_is_a_400_naming_since(
    api: Client, alerts: dict[str, Alert], since: str
) -> None:
    response = api.get("/api/v1/alerts", {"since": since})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["data"]["field"] == "since"
    assert body["message"] == (
        "since: must be on or after 1970-01-01T00:00:00Z and before 9000-01-01T00:00:00Z"
    )


@pytest.mark.parametrize("since", IN_RANGE)
def test_a_since_at_the_edges_of_the_range_is_answered(
    api: Client, alerts: dict[str, Alert], since: str
) -> None:
    expected = (
        []
        if since.startswith("8999")
        else [alerts[k].pk for k in ("ada-down", "bob-wait", "ada-wait")]
    )
    assert ids(api.get("/api/v1/alerts", {"since": since})) == expected


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("kind", "provider\x00wait", "must not contain NUL characters"),
        ("agent", "ada\nbob", "must not contain control characters"),
        ("agent", "ada\x85", "must not contain control characters"),  # C1
        ("agent", "ada\u202e", "must not contain bidirectional text controls"),
        ("agent", "a" * 101, "must be at most 100 characters"),
        ("kind", "k" * 51, "must be at most 50 characters"),
    ],
)
def test_a_kind_or_agent_that_no_alert_can_have_is_a_400_naming_it(
    api: Client, alerts: dict[str, Alert], field: str, value: str, why: str
) -> None:
    """Said as the API's one text check says it of any field."""
    response = api.get("/api/v1/alerts", {field: value})
    assert response.status_code == 400
    assert response.json()["data"]["field"] == field
    assert response.json()["message"] == f"{field}: {why}"


def test_the_list_stops_at_the_newest_500_alerts(api: Client) -> None:
    Alert.objects.bulk_create(
        Alert(kind="turn-exhausted", agent="ada", message=str(i), created_at=T0)
        for i in range(ALERTS_LIMIT + 1)
    )
    Alert.objects.update(created_at=T0)  # one instant: newest is then the larger id
    oldest = Alert.objects.order_by("id").first()
    assert oldest is not None
    listed = ids(api.get("/api/v1/alerts"))
    assert len(listed) == ALERTS_LIMIT == 500
    assert oldest.pk not in listed
    assert listed == sorted(listed, reverse=True)


# --- acknowledge -----------------------------------------------------------------------------


def test_an_alert_is_acknowledged_once_with_an_audit_entry_and_again_is_a_409(
    api: Client, alerts: dict[str, Alert]
) -> None:
    alert = alerts["ada-down"]
    response = acknowledge(api, alert.pk)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (
        body["id"] == alert.pk
        and body["kind"] == "hard-down"
        and body["acknowledged_at"] is not None
    )

    alert.refresh_from_db()
    assert alert.acknowledged_by == "api:test-operator"
    assert alert.acknowledged_at is not None
    at = alert.acknowledged_at
    assert datetime.fromisoformat(body["acknowledged_at"]) == at.replace(
        microsecond=at.microsecond // 1000 * 1000
    )  # JSON has ms
    audit = AuditEntry.objects.get(action="alert.acknowledge")
    assert (audit.actor, audit.target) == ("api:test-operator", f"alert:{alert.pk}")
    assert audit.data == {"kind": "hard-down", "agent": "ada", "model": "m1", "verdict": "history"}

    again = acknowledge(api, alert.pk)
    assert again.status_code == 409
    assert again.json()["code"] == "conflict"
    assert "api:test-operator" in again.json()["message"]
    # The first acknowledgement's instant, written as the 200 wrote it.
    assert again.json()["data"]["acknowledged_at"] == body["acknowledged_at"]
    first_at = alert.acknowledged_at
    alert.refresh_from_db()
    assert alert.acknowledged_at == first_at  # the first acknowledgement stands
    assert AuditEntry.objects.filter(action="alert.acknowledge").count() == 1

    listed = {a["id"]: a for a in api.get("/api/v1/alerts").json()}
    assert listed[alert.pk]["acknowledged_at"] == body["acknowledged_at"]
    assert listed[alerts["ada-wait"].pk]["acknowledged_at"] is None  # only the one named


@pytest.mark.parametrize("alert_id", [999_999, 2**63, 2**80])
def test_acknowledging_an_unknown_alert_is_a_404(
    api: Client, alerts: dict[str, Alert], alert_id: int
) -> None:
    response = acknowledge(api, alert_id)
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert not AuditEntry.objects.exists()


# --- who may ---------------------------------------------------------------------------------

ENDPOINTS = [("get", "/api/v1/alerts"), ("post", "/api/v1/alerts/{id}/acknowledge")]


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
def test_the_alerts_endpoints_answer_403_to_a_token_that_is_not_an_operators(
    alerts: dict[str, Alert], user_token: str, method: str, url: str
) -> None:
    client = Client(headers={"Authorization": f"Bearer {user_token}"})
    response = client.generic(method.upper(), url.format(id=alerts["ada-wait"].pk))
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"
    assert not Alert.objects.filter(acknowledged_at__isnull=False).exists()
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
def test_the_alerts_endpoints_answer_401_without_a_token(
    alerts: dict[str, Alert], method: str, url: str
) -> None:
    assert Client().generic(method.upper(), url.format(id=alerts["ada-wait"].pk)).status_code == 401
