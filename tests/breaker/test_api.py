"""API.md's breaker endpoints over HTTP: GET /agents/{name}/breaker and the restore, operator
only. The router is mounted on a test API here, so these tests do not depend on the main API's
wiring."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client
from django.urls import path
from django.utils import timezone
from ninja import NinjaAPI

from agentops.models import Agent, AuditEntry, HistoryRow
from breaker.probes import breaker_probe_begin
from breaker.services import breaker_note_failure
from interfaces.api import errors
from interfaces.api.auth import TokenAuth
from interfaces.api.breaker_routes import router
from tests.factories import AgentFactory, HistoryRowFactory

api = NinjaAPI(
    title="agentops breaker (tests)",
    version="1",
    auth=TokenAuth(),
    urls_namespace="api-v1-breaker-tests",
)
errors.install(api)
api.add_router("", router)
urlpatterns = [path("api/v1/", api.urls)]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


@pytest.fixture
def agent() -> Agent:
    agent: Agent = AgentFactory.create()
    return agent


@pytest.fixture
def set_aside(agent: Agent) -> HistoryRow:
    r: HistoryRow = HistoryRowFactory.create(
        agent=agent,
        seq=1,
        state=HistoryRow.State.SET_ASIDE,
        set_aside_at=timezone.now(),
        set_aside_by="breaker",
        set_aside_reason="invalid_request at HTTP 400",
    )
    return r


def restore(api: Client, agent: Agent, row_id: int, body: Any = None) -> Any:
    data = "" if body is None else json.dumps(body)
    return api.post(
        f"/api/v1/agents/{agent.name}/history/{row_id}/restore",
        data=data,
        content_type="application/json",
    )


def test_the_breaker_of_an_agent_that_never_failed_reads_as_zero(api: Client, agent: Agent) -> None:
    response = api.get(f"/api/v1/agents/{agent.name}/breaker")
    assert response.status_code == 200
    assert response.json() == {
        "streak": 0,
        "threshold": 3,
        "sheds_this_run": 0,
        "shed_cap": 3,
        "probe": None,
        "set_aside": [],
    }


def test_the_breaker_shows_the_streak_the_probe_and_the_set_aside_rows(
    api: Client, agent: Agent, set_aside: HistoryRow
) -> None:
    for _ in range(3):
        breaker_note_failure(agent=agent, failure_type="invalid_request", http_status=400)
    breaker_probe_begin(agent=agent)
    body = api.get(f"/api/v1/agents/{agent.name}/breaker").json()
    assert body["streak"] == 3 and body["sheds_this_run"] == 0
    assert (
        body["probe"]["status"] == "out"
        and body["probe"]["sent_at"]
        and body["probe"]["verdict"] is None
    )
    (row,) = body["set_aside"]
    assert (
        row["id"] == set_aside.pk
        and row["state"] == "set_aside"
        and row["set_aside_reason"] == "invalid_request at HTTP 400"
    )
    assert set(row) == {
        "id",
        "seq",
        "participant",
        "role",
        "content",
        "state",
        "set_aside_at",
        "set_aside_reason",
        "created_at",
    }


def test_the_breaker_of_an_unknown_agent_is_404(api: Client) -> None:
    response = api.get("/api/v1/agents/nobody/breaker")
    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_restoring_a_row_returns_it_presented_and_audits_it(
    api: Client, agent: Agent, set_aside: HistoryRow
) -> None:
    response = restore(api, agent, set_aside.pk, {"requester": "alice"})
    assert response.status_code == 200
    assert response.json()["state"] == "presented" and response.json()["set_aside_at"] is None
    entry = AuditEntry.objects.get(action="history.restore")
    assert entry.actor == "api:test-operator" and entry.data["requester"] == "alice"


def test_a_restores_reason_is_kept_in_its_audit_entry(
    api: Client, agent: Agent, set_aside: HistoryRow
) -> None:
    response = restore(
        api, agent, set_aside.pk, {"requester": "alice", "reason": "fixed\nupstream"}
    )
    assert response.status_code == 200, response.content
    entry = AuditEntry.objects.get(action="history.restore")
    assert entry.reason == "fixed upstream" and entry.data["reason"] == "fixed upstream"
    assert entry.data["requester"] == "alice"


@pytest.mark.parametrize("reason", [7, ["why"], "bad\x00"])
def test_a_bad_reason_is_a_400_naming_it_and_nothing_is_restored(
    api: Client, agent: Agent, set_aside: HistoryRow, reason: Any
) -> None:
    response = restore(api, agent, set_aside.pk, {"reason": reason})
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == "reason"
    set_aside.refresh_from_db()
    assert set_aside.state == "set_aside"


def test_restoring_with_no_body_is_fine(api: Client, agent: Agent, set_aside: HistoryRow) -> None:
    assert restore(api, agent, set_aside.pk).status_code == 200


def test_restoring_twice_is_a_conflict(api: Client, agent: Agent, set_aside: HistoryRow) -> None:
    assert restore(api, agent, set_aside.pk, {}).status_code == 200
    response = restore(api, agent, set_aside.pk, {})
    assert response.status_code == 409 and response.json()["code"] == "conflict"
    assert AuditEntry.objects.filter(action="history.restore").count() == 1


def test_restoring_an_unknown_row_or_agent_is_404(
    api: Client, agent: Agent, set_aside: HistoryRow
) -> None:
    assert restore(api, agent, set_aside.pk + 1000, {}).status_code == 404
    assert (
        api.post(
            f"/api/v1/agents/nobody/history/{set_aside.pk}/restore",
            data="{}",
            content_type="application/json",
        ).status_code
        == 404
    )


@pytest.mark.parametrize("requester", [7, ["alice"], {"n": "alice"}, False])
def test_a_non_string_requester_is_a_400_naming_it(
    api: Client, agent: Agent, set_aside: HistoryRow, requester: Any
) -> None:
    response = restore(api, agent, set_aside.pk, {"requester": requester})
    assert response.status_code == 400
    assert (
        response.json()["data"]["field"] == "requester"
        and "requester" in response.json()["message"]
    )
    set_aside.refresh_from_db()
    assert set_aside.state == "set_aside"


def test_an_unknown_field_is_a_400_naming_it_and_nothing_is_restored(
    api: Client, agent: Agent, set_aside: HistoryRow
) -> None:
    response = restore(api, agent, set_aside.pk, {"requestor": "alice"})
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == "requestor"
    assert (
        response.json()["message"] == "requestor: is not a field of a restore {requester?, reason?}"
    )
    set_aside.refresh_from_db()
    assert set_aside.state == "set_aside"


@pytest.mark.parametrize("body", ["not json", "[1]", '"x"'])
def test_a_body_that_is_not_a_json_object_is_a_400(
    api: Client, agent: Agent, set_aside: HistoryRow, body: str
) -> None:
    response = api.post(
        f"/api/v1/agents/{agent.name}/history/{set_aside.pk}/restore",
        data=body,
        content_type="application/json",
    )
    assert response.status_code == 400 and response.json()["data"]["field"] == "body"


def test_both_endpoints_answer_403_to_a_non_operator_token(
    user_token: str, agent: Agent, set_aside: HistoryRow
) -> None:
    client = Client(headers={"Authorization": f"Bearer {user_token}"})
    assert client.get(f"/api/v1/agents/{agent.name}/breaker").status_code == 403
    assert restore(client, agent, set_aside.pk, {}).status_code == 403
    set_aside.refresh_from_db()
    assert set_aside.state == "set_aside"


def test_both_endpoints_answer_401_without_a_token(agent: Agent, set_aside: HistoryRow) -> None:
    client = Client()
    assert client.get(f"/api/v1/agents/{agent.name}/breaker").status_code == 401
    assert restore(client, agent, set_aside.pk, {}).status_code == 401
