"""Projects (API.md, Projects): a non-operator token sees and acts only on its own project's
agents, turns, history, completions and websockets; anything else is a 404 exactly like an
unknown name. Operator tokens see every project."""

from __future__ import annotations

import json
from io import StringIO
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.core.management import call_command
from django.test import Client

from agentops.models import Agent, ApiToken, HistoryRow
from agentops.tokens import api_token_check, api_token_create
from inference.models import Turn
from interfaces.asgi import application
from tests.factories import ProviderFactory

pytestmark = pytest.mark.django_db


def client(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def call(c: Client, method: str, url: str, body: Any = None) -> Any:
    return c.generic(
        method, url, "" if body is None else json.dumps(body), content_type="application/json"
    )


@pytest.fixture
def tokens() -> dict[str, str]:
    return {
        "alpha": api_token_create(name="alpha-bot", operator=False, project="alpha")[1],
        "beta": api_token_create(name="beta-bot", operator=False, project="beta")[1],
        "operator": api_token_create(name="ops", operator=True, project="ops")[1],
    }


@pytest.fixture
def agents(tokens: dict[str, str]) -> dict[str, Any]:
    """Each project's token creates its agent through the API, and submits a turn to it."""
    ProviderFactory(name="p1")
    made: dict[str, Any] = {}
    for project, name in (("alpha", "a1"), ("beta", "b1")):
        c = client(tokens[project])
        body = {"name": name, "kind": "conversation", "provider": "p1", "model": "m"}
        created = call(c, "POST", "/api/v1/agents", body)
        assert created.status_code == 201, created.content
        assert created.json()["project"] == project
        turn = call(
            c,
            "POST",
            f"/api/v1/agents/{name}/turns",
            {"messages": [{"participant": "alice", "content": "hi"}]},
        )
        assert turn.status_code == 202, turn.content
        made[name] = turn.json()["id"]
    return made


def not_found_like_unknown(response: Any, name: str) -> None:
    assert response.status_code == 404, response.content
    assert response.json() == {
        "code": "not_found",
        "message": f"no agent named {name!r}",
        "data": {"field": "name"},
    }


AGENT_OPERATIONS = [
    ("GET", "/api/v1/agents/{name}", None),
    ("PATCH", "/api/v1/agents/{name}", {"model": "stolen"}),
    ("DELETE", "/api/v1/agents/{name}", None),
    ("GET", "/api/v1/agents/{name}/history", None),
    ("POST", "/api/v1/agents/{name}/turns", {"messages": [{"participant": "eve", "content": "x"}]}),
    (
        "POST",
        "/api/v1/agents/{name}/complete",
        {"messages": [{"participant": "eve", "content": "x"}]},
    ),
]


@pytest.mark.django_db(transaction=True)  # async views read in the runtime's own threads
@pytest.mark.parametrize(("method", "url", "body"), AGENT_OPERATIONS)
def test_another_projects_agent_answers_exactly_as_an_unknown_one_and_nothing_changes(
    tokens: dict[str, str], agents: dict[str, int], method: str, url: str, body: Any
) -> None:
    alpha = client(tokens["alpha"])
    unknown = call(alpha, method, url.format(name="zz-unknown"), body)
    other = call(alpha, method, url.format(name="b1"), body)
    not_found_like_unknown(unknown, "zz-unknown")
    not_found_like_unknown(other, "b1")
    b1 = Agent.objects.get(name="b1")
    assert (b1.model, b1.disposed_at) == ("m", None)
    assert list(HistoryRow.objects.filter(agent=b1).values_list("participant", flat=True)) == [
        "alice"
    ]
    assert Turn.objects.filter(agent=b1).count() == 1


def test_each_project_sees_its_own_agent_and_an_operator_sees_both(
    tokens: dict[str, str], agents: dict[str, int]
) -> None:
    for project, mine, theirs in (("alpha", "a1", "b1"), ("beta", "b1", "a1")):
        c = client(tokens[project])
        assert call(c, "GET", f"/api/v1/agents/{mine}").json()["project"] == project
        assert call(c, "GET", f"/api/v1/agents/{mine}/history").status_code == 200
        not_found_like_unknown(call(c, "GET", f"/api/v1/agents/{theirs}"), theirs)
    operator = client(tokens["operator"])
    assert {
        call(operator, "GET", f"/api/v1/agents/{n}").json()["project"] for n in ("a1", "b1")
    } == {"alpha", "beta"}
    assert call(operator, "GET", "/api/v1/agents/b1/history").status_code == 200
    assert call(operator, "GET", "/api/v1/agents/b1/breaker").status_code == 200


def test_a_non_operator_can_change_and_delete_only_its_own_agent(
    tokens: dict[str, str], agents: dict[str, int]
) -> None:
    beta = client(tokens["beta"])
    assert call(beta, "PATCH", "/api/v1/agents/b1", {"model": "m2"}).json()["model"] == "m2"
    not_found_like_unknown(call(beta, "DELETE", "/api/v1/agents/a1"), "a1")
    assert Agent.objects.get(name="a1").disposed_at is None
    assert call(client(tokens["alpha"]), "DELETE", "/api/v1/agents/a1").status_code == 204


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("GET", "", None),
        ("POST", "/cancel", None),
        ("POST", "/tool_results", {"results": [{"tool_call_id": "c1", "content": "x"}]}),
    ],
)
def test_another_projects_turn_answers_exactly_as_an_unknown_one(
    tokens: dict[str, str], agents: dict[str, int], method: str, suffix: str, body: Any
) -> None:
    alpha, theirs = client(tokens["alpha"]), agents["b1"]
    unknown = call(alpha, method, f"/api/v1/turns/{theirs + 1000}{suffix}", body)
    other = call(alpha, method, f"/api/v1/turns/{theirs}{suffix}", body)
    assert (unknown.status_code, other.status_code) == (404, 404)
    assert other.json() == {**unknown.json(), "message": f"no turn with id {theirs}"}
    assert Turn.objects.get(pk=theirs).status != Turn.Status.CANCELLED
    assert call(client(tokens["beta"]), "GET", f"/api/v1/turns/{theirs}").status_code == 200
    assert call(client(tokens["operator"]), "GET", f"/api/v1/turns/{theirs}").status_code == 200


@pytest.mark.django_db(transaction=True)  # the consumer reads through connections of its own
@pytest.mark.usefixtures("no_workers")
async def test_the_websocket_of_another_projects_turn_is_refused_as_unknown(
    tokens: dict[str, str], agents: dict[str, int]
) -> None:
    theirs = agents["b1"]

    async def connect(token: str, turn: int) -> tuple[bool, Any]:
        communicator = WebsocketCommunicator(
            application, f"/ws/turns/{turn}?token={token}", headers=[(b"host", b"localhost")]
        )
        connected, _ = await communicator.connect(timeout=10)
        assert connected
        first = await communicator.receive_output(timeout=10)
        await communicator.disconnect()  # the consumer ends with the client's side, refused or not
        if first["type"] == "websocket.close":  # refused, with its code
            return False, first["code"]
        return True, json.loads(first["text"])["status"]

    assert await connect(tokens["alpha"], theirs) == (False, 4404)
    assert await connect(tokens["alpha"], theirs + 1000) == (False, 4404)
    # accepted, with the turn's status first (no worker runs it)
    for token in (tokens["beta"], tokens["operator"]):
        assert await connect(token, theirs) == (True, Turn.Status.QUEUED)
    assert await connect(tokens["operator"], 2**70) == (False, 4404)
    await database_sync_to_async(Agent.objects.count)()


def test_create_api_token_puts_the_token_in_its_project_and_prints_only_the_token() -> None:
    out = StringIO()
    call_command("create_api_token", "ci", "--project", "gamma", stdout=out)
    token = out.getvalue().strip()
    assert "\n" not in token and token.startswith("ao_")
    row = api_token_check(token)
    assert row is not None and (row.name, row.project.name, row.operator) == ("ci", "gamma", False)
    out = StringIO()
    call_command("create_api_token", "root", "--operator", stdout=out)
    row = api_token_check(out.getvalue().strip())
    assert row is not None and (row.project.name, row.operator) == ("default", True)


def test_an_agent_made_without_a_token_belongs_to_the_default_project(
    tokens: dict[str, str],
) -> None:
    from tests.factories import AgentFactory

    agent = AgentFactory.create(name="legacy")
    assert agent.project.name == "default"
    assert ApiToken.objects.get(name="alpha-bot").project.name == "alpha"
    not_found_like_unknown(call(client(tokens["alpha"]), "GET", "/api/v1/agents/legacy"), "legacy")


def test_the_admin_shows_each_agents_project_and_filters_by_it(
    tokens: dict[str, str], agents: dict[str, int], admin_client: Client
) -> None:
    from agentops.models import Project

    page = admin_client.get("/admin/agentops/agent/")
    assert page.status_code == 200
    assert b"alpha" in page.content and b"beta" in page.content
    alpha = Project.objects.get(name="alpha")
    filtered = admin_client.get(f"/admin/agentops/agent/?project__id__exact={alpha.pk}")
    assert b">a1<" in filtered.content and b">b1<" not in filtered.content


def test_the_admin_refuses_a_provider_the_policy_refuses(admin_client: Client) -> None:
    from agentops.models import Provider

    form = {
        "name": "meta",
        "kind": "openai",
        "base_url": "http://169.254.169.254/",
        "api_key_env": "DATABASE_URL",
    }
    page = admin_client.post("/admin/agentops/provider/add/", form)
    assert page.status_code == 200 and b"cloud-metadata" in page.content
    assert not Provider.objects.exists()
    form["base_url"] = "http://127.0.0.1:9/v1"
    page = admin_client.post("/admin/agentops/provider/add/", form)
    assert page.status_code == 200 and b"AGENTOPS_PROVIDER_KEY_ENVS" in page.content
    assert not Provider.objects.exists()
