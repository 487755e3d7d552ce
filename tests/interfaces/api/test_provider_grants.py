"""Providers granted to projects (API.md, Projects; architecture.md §12): once an operator grants
a project a list, its agents may name only those providers, and its tokens see only those; a
provider not granted answers exactly as an unknown one. A project never granted keeps every
provider."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent, AuditEntry, Project
from agentops.tokens import api_token_create
from tests.factories import ProviderFactory

pytestmark = pytest.mark.django_db


def client(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def call(c: Client, method: str, url: str, body: Any = None) -> Any:
    return c.generic(
        method, url, "" if body is None else json.dumps(body), content_type="application/json"
    )


@pytest.fixture
def world() -> dict[str, Client]:
    """Two projects' tenants and an operator, and three providers none of them was granted."""
    for name in ("p1", "p2", "p3"):
        ProviderFactory(name=name)
    return {
        "alpha": client(api_token_create(name="alpha-bot", operator=False, project="alpha")[1]),
        "beta": client(api_token_create(name="beta-bot", operator=False, project="beta")[1]),
        "operator": client(api_token_create(name="ops", operator=True, project="ops")[1]),
    }


def grant(c: Client, project: str, providers: list[str]) -> Any:
    return call(c, "PUT", f"/api/v1/projects/{project}/providers", {"providers": providers})


def names(response: Any) -> list[str]:
    assert response.status_code == 200, response.content
    return [p["name"] for p in response.json()]


def agent_body(name: str, provider: str, **more: Any) -> dict[str, Any]:
    return {"name": name, "kind": "conversation", "provider": provider, "model": "m", **more}


def test_a_project_never_granted_keeps_every_provider(world: dict[str, Client]) -> None:
    assert names(call(world["alpha"], "GET", "/api/v1/providers")) == ["p1", "p2", "p3"]
    answer = call(world["alpha"], "GET", "/api/v1/projects/alpha/providers")
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"project": "alpha", "providers": None, "granted_at": None}
    made = call(world["alpha"], "POST", "/api/v1/agents", agent_body("a1", "p3"))
    assert made.status_code == 201, made.content


def test_a_granted_list_is_all_a_tenant_sees_and_names(world: dict[str, Client]) -> None:
    answer = grant(world["operator"], "alpha", ["p1", "p2"])
    assert answer.status_code == 200, answer.content
    assert answer.json()["providers"] == ["p1", "p2"]
    assert answer.json()["granted_at"] is not None

    alpha = world["alpha"]
    assert names(call(alpha, "GET", "/api/v1/providers")) == ["p1", "p2"]
    assert call(alpha, "GET", "/api/v1/providers/p1").json()["name"] == "p1"
    # Not granted reads as unknown: the same 404, word for word.
    hidden = call(alpha, "GET", "/api/v1/providers/p3")
    unknown = call(alpha, "GET", "/api/v1/providers/nope")
    assert hidden.status_code == unknown.status_code == 404
    assert hidden.json() == {
        "code": "not_found",
        "message": "no provider named 'p3'",
        "data": {"field": "name"},
    }
    assert unknown.json()["message"] == "no provider named 'nope'"

    # Another project and the operator are untouched by alpha's grant.
    assert names(call(world["beta"], "GET", "/api/v1/providers")) == ["p1", "p2", "p3"]
    assert names(call(world["operator"], "GET", "/api/v1/providers")) == ["p1", "p2", "p3"]
    assert call(world["operator"], "GET", "/api/v1/providers/p3").status_code == 200


def refused_as_unknown(response: Any, field: str, name: str) -> None:
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == field
    assert response.json()["message"] == f"{field}: no provider named {name!r}"


def test_an_agent_may_name_only_granted_providers(world: dict[str, Client]) -> None:
    assert grant(world["operator"], "alpha", ["p1", "p2"]).status_code == 200
    alpha = world["alpha"]

    own = call(alpha, "POST", "/api/v1/agents", agent_body("a1", "p3"))
    refused_as_unknown(own, "provider", "p3")
    alternate = call(
        alpha,
        "POST",
        "/api/v1/agents",
        agent_body(
            "a1",
            "p1",
            fallbacks=[{"provider": "p2", "model": "m"}, {"provider": "p3", "model": "m"}],
        ),
    )
    refused_as_unknown(alternate, "fallbacks[1].provider", "p3")
    assert not Agent.objects.filter(name="a1").exists()

    made = call(alpha, "POST", "/api/v1/agents", agent_body("a1", "p1"))
    assert made.status_code == 201, made.content
    patched = call(
        alpha, "PATCH", "/api/v1/agents/a1", {"fallbacks": [{"provider": "p3", "model": "m"}]}
    )
    refused_as_unknown(patched, "fallbacks[0].provider", "p3")
    assert Agent.objects.get(name="a1").fallbacks == []
    # An operator's PATCH of alpha's agent is held to alpha's grant too.
    by_operator = call(
        world["operator"],
        "PATCH",
        "/api/v1/agents/a1",
        {"fallbacks": [{"provider": "p3", "model": "m"}]},
    )
    refused_as_unknown(by_operator, "fallbacks[0].provider", "p3")
    ok = call(
        alpha, "PATCH", "/api/v1/agents/a1", {"fallbacks": [{"provider": "p2", "model": "m"}]}
    )
    assert ok.status_code == 200, ok.content
    # Beta, never granted, may still name p3.
    beta = call(world["beta"], "POST", "/api/v1/agents", agent_body("b1", "p3"))
    assert beta.status_code == 201, beta.content


def test_only_an_operator_grants_and_a_tenant_reads_only_its_own(
    world: dict[str, Client],
) -> None:
    # A tenant's 403 comes before its body is judged (a bad body gets 403 too).
    assert grant(world["alpha"], "alpha", ["p1"]).status_code == 403
    bad = call(world["alpha"], "PUT", "/api/v1/projects/alpha/providers", {"providers": 5})
    assert bad.status_code == 403
    other = call(world["alpha"], "GET", "/api/v1/projects/beta/providers")
    assert other.status_code == 404
    assert other.json()["message"] == "no project named 'beta'"
    assert call(world["operator"], "GET", "/api/v1/projects/beta/providers").status_code == 200
    assert grant(world["operator"], "nowhere", ["p1"]).status_code == 404
    assert Project.objects.get(name="alpha").providers_granted_at is None


def test_an_unknown_provider_in_a_grant_is_named_and_changes_nothing(
    world: dict[str, Client],
) -> None:
    assert grant(world["operator"], "alpha", ["p1"]).status_code == 200
    refused = grant(world["operator"], "alpha", ["p2", "ghost"])
    assert refused.status_code == 400, refused.content
    assert refused.json()["data"]["field"] == "providers[1]"
    assert refused.json()["message"] == "providers[1]: no provider named 'ghost'"
    shaped = call(world["operator"], "PUT", "/api/v1/projects/alpha/providers", {"providers": "p1"})
    assert shaped.status_code == 400
    assert shaped.json()["data"]["field"] == "providers"
    extra = call(
        world["operator"], "PUT", "/api/v1/projects/alpha/providers", {"providers": [], "x": 1}
    )
    assert extra.status_code == 400
    assert extra.json()["data"]["field"] == "x"
    assert names(call(world["alpha"], "GET", "/api/v1/providers")) == ["p1"]


def test_a_grant_that_leaves_out_a_live_agents_provider_is_refused(
    world: dict[str, Client],
) -> None:
    body = agent_body("a1", "p1", fallbacks=[{"provider": "p2", "model": "m"}])
    assert call(world["alpha"], "POST", "/api/v1/agents", body).status_code == 201

    refused = grant(world["operator"], "alpha", ["p1"])
    assert refused.status_code == 409, refused.content
    assert refused.json()["data"] == {
        "field": "providers",
        "agents": [{"agent": "a1", "field": "fallbacks[0].provider", "provider": "p2"}],
    }
    assert (
        call(world["alpha"], "GET", "/api/v1/projects/alpha/providers").json()["providers"] is None
    )

    # Once the agent is disposed of, the list may leave its providers out.
    assert call(world["alpha"], "DELETE", "/api/v1/agents/a1").status_code == 204
    assert grant(world["operator"], "alpha", ["p3"]).status_code == 200


def test_a_grant_is_audited_with_the_list_it_replaced(world: dict[str, Client]) -> None:
    assert grant(world["operator"], "alpha", ["p2", "p1"]).status_code == 200
    assert grant(world["operator"], "alpha", []).status_code == 200
    entries = AuditEntry.objects.filter(action="project.providers-grant").order_by("at", "id")
    assert [(e.actor, e.target, e.data) for e in entries] == [
        ("api:ops", "project:alpha", {"providers": ["p1", "p2"], "before": None}),
        ("api:ops", "project:alpha", {"providers": [], "before": ["p1", "p2"]}),
    ]
    # An empty grant is a list: no provider at all.
    assert names(call(world["alpha"], "GET", "/api/v1/providers")) == []
    refused_as_unknown(
        call(world["alpha"], "POST", "/api/v1/agents", agent_body("a1", "p1")), "provider", "p1"
    )
