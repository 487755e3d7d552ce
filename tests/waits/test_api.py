"""API.md's Waits endpoints over HTTP: operator only, 400 naming the field, 404, receipts."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent, AuditEntry
from waits.clock import clock_ms
from waits.models import WaitJournalEntry
from waits.services import wait_record

from .conftest import insert_row, restart

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.waits.urls")]


def post(client: Client, url: str, body: Any) -> Any:
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json")


@pytest.fixture
def held_agent(agent: Agent) -> Agent:
    now = clock_ms()
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429 slow down", now_ms=now)
    wait_record(
        agent=agent, model="m2", retry_after_ms=math.nan, reason="429 until released", now_ms=now
    )
    return agent


ENDPOINTS = [
    ("get", "/api/v1/waits"),
    ("post", "/api/v1/waits/release"),
    ("get", "/api/v1/waits/journal"),
]


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
def test_the_waits_endpoints_answer_403_to_a_token_that_is_not_an_operators(
    held_agent: Agent, user_token: str, method: str, url: str
) -> None:
    client = Client(headers={"Authorization": f"Bearer {user_token}"})
    response = client.generic(
        method.upper(), url, json.dumps({"agent": "ada"}), content_type="application/json"
    )
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"
    assert WaitJournalEntry.objects.filter(kind="release").count() == 0


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
def test_the_waits_endpoints_answer_401_without_a_token(db: None, method: str, url: str) -> None:
    assert (
        Client().generic(method.upper(), url, "{}", content_type="application/json").status_code
        == 401
    )


def test_get_waits_lists_the_binding_waits(held_agent: Agent, api: Client) -> None:
    body = api.get("/api/v1/waits").json()
    assert body["journal_readable"] is True
    assert [(w["agent"], w["model"], w["source"], w["reason"]) for w in body["waits"]] == [
        ("ada", "m1", "recorded", "429 slow down"),
        ("ada", "m2", "recorded", "429 until released"),
    ]
    assert body["waits"][0]["until"].endswith("Z") and body["waits"][1]["until"] is None
    assert body["waits"][0]["set_at"]
    assert [w["model"] for w in api.get("/api/v1/waits?agent=ada&model=m2").json()["waits"]] == [
        "m2"
    ]
    assert api.get("/api/v1/waits?agent=bob").json()["waits"] == []


def test_get_waits_shows_every_agent_held_on_star_while_the_records_are_unreadable(
    held_agent: Agent, api: Client
) -> None:
    insert_row(kind="pause")
    restart()
    body = api.get("/api/v1/waits?agent=ada").json()
    assert body["journal_readable"] is False
    assert ("ada", "*", "unreadable", None) in [
        (w["agent"], w["model"], w["source"], w["until"]) for w in body["waits"]
    ]


@pytest.mark.parametrize("body", [{"agent": "ada"}, {"agent": "ada", "model": "*"}])
def test_release_without_a_model_or_with_star_releases_every_model(
    held_agent: Agent, api: Client, body: dict[str, Any]
) -> None:
    response = post(
        api, "/api/v1/waits/release", {**body, "requester": "ops", "reason": "provider recovered"}
    )
    assert response.status_code == 200, response.content
    receipts = response.json()["receipts"]
    assert [(r["agent"], r["model"], r["release"]) for r in receipts] == [
        ("ada", "m1", "recorded"),
        ("ada", "m2", "recorded"),
    ]
    assert receipts[1]["until"] is None
    assert api.get("/api/v1/waits").json()["waits"] == []
    entry = AuditEntry.objects.get(action="wait.release")
    # The actor is the calling token; the free-text requester is kept in the entry's data.
    assert (entry.actor, entry.reason, entry.target) == (
        "api:test-operator",
        "provider recovered",
        "ada/*",
    )
    assert entry.data["requester"] == "ops"


def test_release_of_one_model_returns_its_receipt(held_agent: Agent, api: Client) -> None:
    response = post(api, "/api/v1/waits/release", {"agent": "ada", "model": "m1"})
    assert [(r["model"], r["release"]) for r in response.json()["receipts"]] == [("m1", "recorded")]
    assert AuditEntry.objects.get().actor == "api:test-operator"  # no requester: the token's name
    assert [w["model"] for w in api.get("/api/v1/waits").json()["waits"]] == ["m2"]


@pytest.mark.parametrize(
    ("field", "body"),
    [
        ("model", {"agent": "ada", "model": ""}),
        ("model", {"agent": "ada", "model": None}),
        ("model", {"agent": "ada", "model": 5}),
        ("model", {"agent": "ada", "model": ["m1"]}),
        ("model", {"agent": "ada", "model": {"name": "m1"}}),
        ("model", {"agent": "ada", "model": False}),
        ("model", {"agent": "ada", "model": "m1\u0000"}),
        ("model", {"agent": "ada", "model": "m1\r\nX-Forged: yes"}),
        ("agent", {"agent": "ada\u001b"}),
        ("agent", {"agent": 7}),
        ("agent", {"agent": None}),
        ("agent", {"model": "m1"}),
        ("requester", {"agent": "ada", "requester": ["ops"]}),
        ("reason", {"agent": "ada", "reason": {"why": 1}}),
        # A misspelt model must not release every model.
        ("modle", {"agent": "ada", "modle": "m1", "reason": "typo test"}),
        ("requestor", {"agent": "ada", "model": "m1", "requestor": "ops"}),
        ("body", "not json"),
        ("body", ["ada"]),
    ],
)
def test_an_invalid_release_is_a_400_naming_the_field_and_changes_nothing(
    held_agent: Agent, api: Client, field: str, body: Any
) -> None:
    rows = WaitJournalEntry.objects.count()
    response = post(api, "/api/v1/waits/release", body)
    assert response.status_code == 400, response.content
    error = response.json()
    assert error["code"] == "bad_request" and error["data"]["field"] == field
    assert error["message"].startswith(f"{field}: ")
    assert WaitJournalEntry.objects.count() == rows and not AuditEntry.objects.exists()
    assert len(api.get("/api/v1/waits").json()["waits"]) == 2


def test_releasing_an_unknown_agent_is_a_404(held_agent: Agent, api: Client) -> None:
    response = post(api, "/api/v1/waits/release", {"agent": "nobody"})
    assert response.status_code == 404
    assert response.json()["data"]["field"] == "agent"
    assert not AuditEntry.objects.exists()


def test_the_journal_lists_entries_newest_first_with_their_fields(
    held_agent: Agent, api: Client
) -> None:
    post(api, "/api/v1/waits/release", {"agent": "ada", "model": "m1", "requester": "ops"})
    bad = insert_row(kind="pause", agent="bob")
    entries = api.get("/api/v1/waits/journal").json()
    assert [(e["kind"], e["agent"], e["model"]) for e in entries] == [
        ("pause", "bob", "m1"),
        ("release", "ada", "m1"),
        ("set", "ada", "m2"),
        ("set", "ada", "m1"),
    ]
    assert {"id", "kind", "agent", "model", "until", "reason", "by", "at"} <= set(entries[0])
    assert entries[0]["id"] == bad and "unknown kind" in entries[0]["problem"]
    assert entries[1]["by"] == "api:test-operator" and entries[1]["problem"] is None
    assert entries[2]["until"] is None and entries[3]["until"].endswith("Z")
    assert [e["kind"] for e in api.get("/api/v1/waits/journal?agent=ada&limit=2").json()] == [
        "release",
        "set",
    ]


@pytest.mark.parametrize("limit", ["0", "1001", "-1", "abc", "1.5"])
def test_a_journal_limit_out_of_range_is_a_400_naming_limit(
    db: None, api: Client, limit: str
) -> None:
    response = api.get(f"/api/v1/waits/journal?limit={limit}")
    assert response.status_code == 400
    assert response.json()["data"]["field"] == "limit"
