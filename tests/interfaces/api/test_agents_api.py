"""An agent's holds (its binding waits, as ``GET /waits`` lists them) and ``GET /agents``:
the agents with status, failure streak and holds, paginated, filtered by ``?status=``."""

from __future__ import annotations

import math
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent
from inference.models import Turn
from tests.factories import AgentFactory, ProviderFactory, TurnFactory
from waits.clock import clock_ms
from waits.services import wait_record, wait_release

pytestmark = pytest.mark.django_db


@pytest.fixture
def agents() -> dict[str, Agent]:
    provider = ProviderFactory(name="p1")
    made = {
        name: AgentFactory.create(name=name, provider=provider, model="m1")
        for name in ("ada", "bob", "cy", "dee")
    }
    TurnFactory.create(agent=made["bob"], status=Turn.Status.RUNNING)
    TurnFactory.create(agent=made["cy"], status=Turn.Status.HELD)
    TurnFactory.create(agent=made["dee"], status=Turn.Status.QUEUED)
    return made


def held(agent: Agent) -> None:
    now = clock_ms()
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429 slow down", now_ms=now)
    wait_record(
        agent=agent, model="m2", retry_after_ms=math.nan, reason="429 until released", now_ms=now
    )


def test_an_agent_lists_its_binding_waits_as_get_waits_does(
    api: Client, agents: dict[str, Agent]
) -> None:
    held(agents["cy"])
    agent = api.get("/api/v1/agents/cy").json()
    waits = api.get("/api/v1/waits", {"agent": "cy"}).json()["waits"]
    assert [(h["model"], h["source"]) for h in agent["holds"]] == [
        ("m1", "recorded"),
        ("m2", "recorded"),
    ]
    assert agent["holds"] == waits
    assert agent["holds"][1]["until"] is None
    assert api.get("/api/v1/agents/ada").json()["holds"] == []


def test_a_released_wait_leaves_the_agents_holds(api: Client, agents: dict[str, Agent]) -> None:
    held(agents["cy"])
    wait_release(agent="cy", model="m2", reason="fixed", via="api", requester="ops")
    assert [h["model"] for h in api.get("/api/v1/agents/cy").json()["holds"]] == ["m1"]


def test_get_agents_lists_every_live_agent_with_status_streak_and_holds(
    api: Client, agents: dict[str, Agent]
) -> None:
    held(agents["cy"])
    AgentFactory.create(
        name="gone", provider=agents["ada"].provider, disposed_at="2026-01-01T00:00:00Z"
    )
    body = api.get("/api/v1/agents").json()
    assert body["count"] == 4
    rows = {a["name"]: a for a in body["items"]}
    assert list(rows) == ["ada", "bob", "cy", "dee"]
    assert {n: a["status"] for n, a in rows.items()} == {
        "ada": "idle",
        "bob": "running",
        "cy": "held",
        "dee": "queued",
    }
    assert [h["model"] for h in rows["cy"]["holds"]] == ["m1", "m2"]
    assert rows["ada"]["holds"] == [] and rows["ada"]["failure_streak"] == 0
    assert rows["cy"] == api.get("/api/v1/agents/cy").json()


@pytest.mark.parametrize(
    ("status", "names"),
    [("held", ["cy"]), ("idle", ["ada"]), ("running", ["bob"]), ("requires_action", [])],
)
def test_get_agents_filters_by_status(
    api: Client, agents: dict[str, Agent], status: str, names: list[str]
) -> None:
    body = api.get("/api/v1/agents", {"status": status}).json()
    assert [a["name"] for a in body["items"]] == names
    assert body["count"] == len(names)


def test_get_agents_pages_with_limit_and_offset(api: Client, agents: dict[str, Agent]) -> None:
    body = api.get("/api/v1/agents", {"limit": 2, "offset": 1}).json()
    assert [a["name"] for a in body["items"]] == ["bob", "cy"]
    assert body["count"] == 4


@pytest.mark.parametrize(
    ("query", "field"),
    [({"status": "asleep"}, "status"), ({"limit": "x"}, "limit"), ({"offset": -1}, "offset")],
)
def test_get_agents_refuses_a_bad_filter_with_400_naming_it(
    api: Client, agents: dict[str, Agent], query: dict[str, Any], field: str
) -> None:
    response = api.get("/api/v1/agents", query)
    assert response.status_code == 400
    assert response.json()["data"]["field"] == field


def test_get_agents_needs_a_token(agents: dict[str, Agent]) -> None:
    assert Client().get("/api/v1/agents").status_code == 401


def test_get_agents_shows_a_client_only_its_projects_agents_and_filters_by_project(
    api: Client, agents: dict[str, Agent]
) -> None:
    from agentops.models import Project
    from agentops.tokens import api_token_create

    billing = Project.objects.create(name="billing")
    AgentFactory.create(name="invoicer", provider=agents["ada"].provider, project=billing)
    token = api_token_create(name="billing-bot", operator=False, project="billing")[1]
    client = Client(headers={"Authorization": f"Bearer {token}"})
    mine = client.get("/api/v1/agents").json()
    assert (mine["count"], [a["name"] for a in mine["items"]]) == (1, ["invoicer"])
    assert client.get("/api/v1/agents", {"project": "default"}).json() == {"items": [], "count": 0}
    # An operator sees every project, and ?project= keeps one.
    assert api.get("/api/v1/agents").json()["count"] == 5
    only = api.get("/api/v1/agents", {"project": "billing"}).json()
    assert [(a["name"], a["project"]) for a in only["items"]] == [("invoicer", "billing")]
    assert api.get("/api/v1/agents", {"project": "bad\x00name"}).status_code == 400
