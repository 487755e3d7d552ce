"""The HTTP contract of API.md: auth, validation (400 naming the field), 404, 403, 409."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent, AuditEntry, HistoryRow, Provider
from inference.models import Turn
from tests.factories import AgentFactory, ProviderFactory, TurnFactory

pytestmark = pytest.mark.django_db


def post(client: Client, url: str, body: Any) -> Any:
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(url, data=data, content_type="application/json")


def patch(client: Client, url: str, body: Any) -> Any:
    return client.patch(url, data=json.dumps(body), content_type="application/json")


def call(client: Client, method: str, url: str, body: Any = None) -> Any:
    data = "" if body is None else json.dumps(body)
    return client.generic(method.upper(), url, data, content_type="application/json")


@pytest.fixture
def agent() -> Agent:
    agent: Agent = AgentFactory.create(name="ada", provider=ProviderFactory(name="p1"))
    return agent


# --- authentication and authorization ---------------------------------------------

ENDPOINTS = [
    ("get", "/api/v1/providers"),
    ("post", "/api/v1/providers"),
    ("post", "/api/v1/agents"),
    ("get", "/api/v1/agents/ada"),
    ("patch", "/api/v1/agents/ada"),
    ("delete", "/api/v1/agents/ada"),
    ("get", "/api/v1/agents/ada/history"),
    ("post", "/api/v1/agents/ada/turns"),
    ("get", "/api/v1/turns/1"),
    ("post", "/api/v1/turns/1/cancel"),
    ("post", "/api/v1/turns/1/tool_results"),
]


@pytest.mark.parametrize(("method", "url"), ENDPOINTS)
@pytest.mark.parametrize("header", [None, "Bearer nope", "Basic abc", "Bearer "])
def test_every_endpoint_refuses_a_missing_or_bad_token_with_401(
    agent: Agent, method: str, url: str, header: str | None
) -> None:
    client = Client(headers={"Authorization": header} if header else {})
    response = call(client, method, url, {})
    assert response.status_code == 401
    assert response.json()["code"] == "unauthorized"
    assert Agent.objects.filter(disposed_at__isnull=True).count() == 1


OPERATOR_ENDPOINTS = [
    (
        "post",
        "/api/v1/providers",
        {"name": "x", "kind": "openai", "base_url": "http://127.0.0.1:1/v1"},
    ),
]


@pytest.mark.parametrize(("method", "url", "body"), OPERATOR_ENDPOINTS)
def test_operator_endpoints_refuse_a_non_operator_token_with_403(
    user_token: str, method: str, url: str, body: Any
) -> None:
    client = Client(headers={"Authorization": f"Bearer {user_token}"})
    response = call(client, method, url, body)
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden"
    assert not Provider.objects.filter(name="x").exists()


def test_health_needs_no_token() -> None:
    response = Client().get("/api/v1/health")
    assert response.status_code == 200
    body = response.json()
    assert body["database"] is True and body["redis"] is True and body["status"] == "ok"


@pytest.mark.parametrize("url", ["/health", "/metrics"])
@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
def test_the_scrape_targets_refuse_another_method_with_405(url: str, method: str) -> None:
    """A browser's CSRF check (no cookie) answered these 403 with Django's HTML page."""
    response = Client(enforce_csrf_checks=True).generic(method, url)
    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"


def test_a_turn_id_is_named_alike_in_its_400_and_its_404(api: Client) -> None:
    """As the OpenAPI document names the path parameter (the 404 said ``id``)."""
    malformed, unknown = api.get("/api/v1/turns/abc"), api.get("/api/v1/turns/999999")
    assert (malformed.status_code, unknown.status_code) == (400, 404)
    assert malformed.json()["data"]["field"] == unknown.json()["data"]["field"] == "turn_id"


def test_the_openapi_document_is_served(api: Client) -> None:
    response = api.get("/api/v1/openapi.json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    assert "/api/v1/agents/{name}/turns" in paths and "/api/v1/turns/{turn_id}" in paths


# --- providers ----------------------------------------------------------------------

GOOD_PROVIDER = {
    "name": "prov",
    "kind": "openai",
    "base_url": "http://127.0.0.1:9/v1",
    "api_key_env": "OPENAI_API_KEY",
}


@pytest.fixture(autouse=True)
def _provider_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # a provider's key variable must be set


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", ""),
        ("name", "has space"),
        ("name", 5),
        ("name", "x" * 101),
        ("kind", "gemini"),
        ("kind", None),
        ("kind", 1),
        ("base_url", "ftp://x"),
        ("base_url", "not a url"),
        ("base_url", ["http://a"]),
        ("api_key_env", "sk-live-123"),
        ("api_key_env", 7),
    ],
)
def test_provider_create_refuses_each_malformed_field_with_400_naming_it(
    api: Client, field: str, value: Any
) -> None:
    response = post(api, "/api/v1/providers", {**GOOD_PROVIDER, field: value})
    assert response.status_code == 400, response.content
    assert response.json()["message"].startswith(f"{field}:")
    assert response.json()["data"]["field"] == field
    assert not Provider.objects.exists()


@pytest.mark.parametrize("missing", ["name", "kind", "base_url"])
def test_provider_create_names_a_missing_field(api: Client, missing: str) -> None:
    body = {k: v for k, v in GOOD_PROVIDER.items() if k != missing}
    response = post(api, "/api/v1/providers", body)
    assert response.status_code == 400
    assert response.json()["data"]["field"] == missing


def test_provider_create_and_list(api: Client) -> None:
    assert post(api, "/api/v1/providers", GOOD_PROVIDER).status_code == 201
    assert post(api, "/api/v1/providers", GOOD_PROVIDER).status_code == 409
    listed = api.get("/api/v1/providers").json()
    assert listed == [
        {
            "name": "prov",
            "kind": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "api_key_env": "OPENAI_API_KEY",
        }
    ]


@pytest.mark.parametrize("kind", [choice.value for choice in Provider.Kind])
def test_a_provider_of_every_kind_is_created_and_listed(api: Client, kind: str) -> None:
    created = post(api, "/api/v1/providers", {**GOOD_PROVIDER, "kind": kind})
    assert created.status_code == 201, created.content
    assert created.json()["kind"] == kind
    listed = api.get("/api/v1/providers")
    assert listed.status_code == 200, listed.content
    assert [p["kind"] for p in listed.json()] == [kind]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/api/v1/waits/release", {}, "agent"),  # a body read by hand
        (
            "/api/v1/agents",
            {"name": "ada", "provider": "nope", "model": "m"},
            "provider",
        ),  # a service's check
        ("/api/v1/providers", {**GOOD_PROVIDER, "kind": "gemini"}, "kind"),  # the schema's
        ("/api/v1/providers", "{", "body"),  # ninja's parser's
    ],
)
def test_every_400_lists_its_field_in_data_errors(
    api: Client, path: str, body: Any, field: str
) -> None:
    response = post(api, path, body)
    assert response.status_code == 400, response.content
    out = response.json()
    assert out["data"]["field"] == field
    [error] = out["data"]["errors"]
    assert (
        error["field"] == field
        and error["message"]
        and not error["message"].startswith(f"{field}:")
    )
    assert out["message"] == f"{field}: {error['message']}"


@pytest.mark.parametrize(
    ("method", "url", "body", "message"),
    [
        (
            "patch",
            "/api/v1/agents/ada",
            {"fallbacks": [{"provider": "p1", "model": "m" * 201}]},
            "fallbacks[0].model: String should have at most 200 characters",
        ),
        (
            "post",
            "/api/v1/agents/ada/turns",
            {"messages": [{"participant": "p" * 101, "content": "hi"}]},
            "messages[0].participant: String should have at most 100 characters",
        ),
        (
            "post",
            "/api/v1/agents/ada/turns",
            {"messages": [{"participant": "alice", "content": ""}]},
            "messages[0].content: String should have at least 1 character",
        ),
        (
            "patch",
            "/api/v1/agents/ada",
            {"model": "a\nb"},
            "model: must not contain control characters",
        ),
        (
            "patch",
            "/api/v1/agents/ada",
            {"fallbacks": [{"provider": "p1", "model": "m"}] * 5},
            "fallbacks: List should have at most 4 items after validation, not 5",
        ),
    ],
)
def test_a_schemas_message_says_characters_of_a_string_and_no_value_error_prefix(
    api: Client, agent: Agent, method: str, url: str, body: Any, message: str
) -> None:
    response = call(api, method, url, body)
    assert response.status_code == 400, response.content
    out = response.json()
    assert out["message"] == message
    field = out["data"]["field"]
    assert out["data"]["errors"][0] == {"field": field, "message": message[len(field) + 2 :]}


def test_a_provider_without_a_key_reads_back_null_as_posted(api: Client) -> None:
    keyless = {k: v for k, v in GOOD_PROVIDER.items() if k != "api_key_env"}
    created = post(api, "/api/v1/providers", keyless)
    assert created.status_code == 201, created.content
    assert created.json()["api_key_env"] is None
    assert [p["api_key_env"] for p in api.get("/api/v1/providers").json()] == [None]
    assert Provider.objects.get().api_key_env == ""  # stored as the column's empty value


def test_an_unknown_field_is_refused_and_named(api: Client) -> None:
    response = post(api, "/api/v1/providers", {**GOOD_PROVIDER, "api_key": "sk-secret"})
    assert response.status_code == 400
    assert response.json()["data"]["field"] == "api_key"


MESSAGE = {"participant": "alice", "content": "hi"}


@pytest.mark.parametrize(
    ("method", "url", "body", "field"),
    [
        ("post", "/api/v1/providers", {**GOOD_PROVIDER, "typo": 1}, "typo"),
        (
            "post",
            "/api/v1/agents",
            {"name": "bob", "provider": "p1", "model": "m", "typo": 1},
            "typo",
        ),
        ("patch", "/api/v1/agents/ada", {"modle": "other"}, "modle"),
        (
            "patch",
            "/api/v1/agents/ada",
            {"fallbacks": [{"provider": "p1", "model": "m", "typo": 1}]},
            "fallbacks[0].typo",
        ),
        ("post", "/api/v1/agents/ada/turns", {"messages": [MESSAGE], "typo": 1}, "typo"),
        (
            "post",
            "/api/v1/agents/ada/turns",
            {"messages": [{**MESSAGE, "role": "user"}]},
            "messages[0].role",
        ),
        (
            "post",
            "/api/v1/turns/1/tool_results",
            {"results": [{"tool_call_id": "t", "content": "x"}], "typo": 1},
            "typo",
        ),
        (
            "post",
            "/api/v1/prices",
            {
                "provider": "p1",
                "model": "m",
                "input_per_mtok": 1,
                "output_per_mtok": 1,
                "effective_form": "2026-01-01T00:00:00Z",
            },
            "effective_form",
        ),
        ("put", "/api/v1/agents/ada/budget", {"amount": 1, "period": "day", "typo": 1}, "typo"),
        (
            "put",
            "/api/v1/projects/default/budget",
            {"amount": 1, "period": "day", "typo": 1},
            "typo",
        ),
        (
            "post",
            "/api/v1/waits/release",
            {"agent": "ada", "modle": "m", "reason": "typo test"},
            "modle",
        ),
        ("post", "/api/v1/agents/ada/history/1/restore", {"requestor": "alice"}, "requestor"),
    ],
)
def test_every_body_refuses_a_field_it_does_not_know_naming_it_and_changes_nothing(
    api: Client, agent: Agent, method: str, url: str, body: Any, field: str
) -> None:
    """A misspelt field is never ignored: a release without its model releases every model."""
    before = Agent.objects.values().get(pk=agent.pk)
    response = call(api, method, url, body)
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == field, response.json()
    assert response.json()["message"].startswith(f"{field}: ")
    assert Agent.objects.values().get(pk=agent.pk) == before
    assert not AuditEntry.objects.exists() and not Turn.objects.exists()


@pytest.mark.parametrize("body", ["{not json", "", "[]", "null", "42"])
def test_a_body_that_is_not_a_json_object_is_a_400(api: Client, body: str) -> None:
    response = post(api, "/api/v1/providers", body)
    assert response.status_code == 400
    assert response.json()["code"] == "bad_request"


def test_an_oversized_body_is_refused_with_413(api: Client, agent: Agent) -> None:
    big = {"messages": [{"participant": "alice", "content": "x" * 150_000} for _ in range(10)]}
    response = post(api, "/api/v1/agents/ada/turns", big)
    assert response.status_code == 413
    assert not HistoryRow.objects.exists()


# --- agents -------------------------------------------------------------------------


GOOD_AGENT = {"name": "bob", "kind": "resident", "provider": "p1", "model": "answer"}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("name", ""),
        ("name", "../etc"),
        ("kind", "daemon"),
        ("provider", "nope"),
        ("provider", 3),
        ("model", ""),
        ("model", "a\nb"),
        ("participant", ""),
        ("participant", "bell\x07"),
        ("system", 5),
        ("max_tokens", 0),
        ("max_tokens", -1),
        ("max_tokens", "100"),
        ("max_tokens", 1.5),
        ("thinking_budget", 0),
        ("stream", "yes"),
        ("stream", 1),
        ("tools", "lookup"),
    ],
)
def test_agent_create_refuses_each_malformed_field_with_400_naming_it(
    api: Client, agent: Agent, field: str, value: Any
) -> None:
    response = post(api, "/api/v1/agents", {**GOOD_AGENT, field: value})
    assert response.status_code == 400, response.content
    assert response.json()["message"].startswith(f"{field}"), response.json()
    assert response.json()["data"]["field"] == field
    assert not Agent.objects.filter(name="bob").exists()


def test_agent_create_read_patch(api: Client, agent: Agent) -> None:
    response = post(api, "/api/v1/agents", GOOD_AGENT)
    assert response.status_code == 201
    body = response.json()
    assert (
        body["participant"] == "bob"
        and body["status"] == "idle"
        and body["holds"] == []
        and body["current_turn"] is None
    )
    assert post(api, "/api/v1/agents", GOOD_AGENT).status_code == 409
    response = patch(api, "/api/v1/agents/bob", {"model": "think", "max_tokens": 99})
    assert response.status_code == 200
    assert response.json()["model"] == "think" and response.json()["max_tokens"] == 99


@pytest.mark.parametrize(
    ("field", "value"),
    [("model", ""), ("model", None), ("max_tokens", 0), ("system", 1), ("name", "x")],
)
def test_agent_patch_refuses_malformed_fields(
    api: Client, agent: Agent, field: str, value: Any
) -> None:
    response = patch(api, "/api/v1/agents/ada", {field: value})
    assert response.status_code == 400
    assert response.json()["data"]["field"] == field
    agent.refresh_from_db()
    assert agent.model == "answer"


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("get", "/api/v1/agents/nobody"),
        ("patch", "/api/v1/agents/nobody"),
        ("delete", "/api/v1/agents/nobody"),
        ("get", "/api/v1/agents/nobody/history"),
        ("post", "/api/v1/agents/nobody/turns"),
    ],
)
def test_unknown_agents_are_404(api: Client, method: str, url: str) -> None:
    body = {"messages": [{"participant": "a", "content": "b"}]} if url.endswith("turns") else {}
    response = call(api, method, url, body)
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_a_resident_cannot_be_disposed_but_a_conversation_can(api: Client, agent: Agent) -> None:
    assert api.delete("/api/v1/agents/ada").status_code == 409
    AgentFactory(name="chat", kind=Agent.Kind.CONVERSATION, provider=agent.provider)
    assert api.delete("/api/v1/agents/chat").status_code == 204
    assert api.get("/api/v1/agents/chat").status_code == 404
    assert AuditEntry.objects.filter(action="agent.dispose", target="agent:chat").exists()
    # Its name is never reused.
    assert post(api, "/api/v1/agents", {**GOOD_AGENT, "name": "chat"}).status_code == 409


# --- turns --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"participant": "a"}]}, "messages[0].content"),
        ({"messages": [{"participant": "", "content": "x"}]}, "messages[0].participant"),
        ({"messages": [{"participant": "a", "content": ""}]}, "messages[0].content"),
        ({"messages": [{"participant": "a", "content": 5}]}, "messages[0].content"),
        (
            {
                "messages": [
                    {"participant": "a", "content": "ok"},
                    {"participant": "b\x00", "content": "x"},
                ]
            },
            "messages[1].participant",
        ),
        ({"messages": [{"participant": "a", "content": "nul\x00"}]}, "messages[0].content"),
    ],
)
def test_turn_submit_refuses_malformed_messages_and_stores_nothing(
    api: Client, agent: Agent, body: Any, field: str
) -> None:
    response = post(api, "/api/v1/agents/ada/turns", body)
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == field
    assert not HistoryRow.objects.exists() and not Turn.objects.exists()


def test_messages_join_a_queued_turn(api: Client, agent: Agent) -> None:
    first = post(
        api, "/api/v1/agents/ada/turns", {"messages": [{"participant": "alice", "content": "one"}]}
    ).json()
    second = post(
        api, "/api/v1/agents/ada/turns", {"messages": [{"participant": "bob", "content": "two"}]}
    ).json()
    assert first["joined"] is False and second["joined"] is True and second["id"] == first["id"]
    turn = Turn.objects.get()
    assert sorted(turn.trigger_rows.values_list("seq", flat=True)) == [1, 2]


@pytest.mark.parametrize(
    ("url", "body", "field"),
    [
        ("/api/v1/turns/{id}/tool_results", {"results": []}, "results"),
        (
            "/api/v1/turns/{id}/tool_results",
            {"results": [{"tool_call_id": "", "content": "x"}]},
            "results[0].tool_call_id",
        ),
        (
            "/api/v1/turns/{id}/tool_results",
            {"results": [{"tool_call_id": "t", "content": 1}]},
            "results[0].content",
        ),
    ],
)
def test_tool_results_refuse_malformed_fields(
    api: Client, agent: Agent, url: str, body: Any, field: str
) -> None:
    turn = TurnFactory.create(
        agent=agent,
        status=Turn.Status.REQUIRES_ACTION,
        pending_tool_calls=[{"id": "t", "name": "f", "arguments": {}}],
    )
    response = post(api, url.format(id=turn.pk), body)
    assert response.status_code == 400
    assert response.json()["data"]["field"] == field


def test_tool_results_must_match_the_pending_calls(api: Client, agent: Agent) -> None:
    turn = TurnFactory.create(
        agent=agent,
        status=Turn.Status.REQUIRES_ACTION,
        pending_tool_calls=[{"id": "t1", "name": "f", "arguments": {}}],
    )
    response = post(
        api,
        f"/api/v1/turns/{turn.pk}/tool_results",
        {"results": [{"tool_call_id": "zz", "content": "x"}]},
    )
    assert (
        response.status_code == 400 and response.json()["data"]["field"] == "results.tool_call_id"
    )
    queued = TurnFactory.create(agent=agent, status=Turn.Status.QUEUED)
    response = post(
        api,
        f"/api/v1/turns/{queued.pk}/tool_results",
        {"results": [{"tool_call_id": "t1", "content": "x"}]},
    )
    assert response.status_code == 409
    assert not HistoryRow.objects.exists()


@pytest.mark.parametrize(
    ("method", "url"),
    [
        ("get", "/api/v1/turns/999999"),
        ("post", "/api/v1/turns/999999/cancel"),
        ("post", "/api/v1/turns/999999/tool_results"),
    ],
)
def test_unknown_turns_are_404(api: Client, method: str, url: str) -> None:
    body = {"results": [{"tool_call_id": "a", "content": "b"}]}
    response = call(api, method, url, body)
    assert response.status_code == 404


@pytest.mark.parametrize("turn_id", ["abc", "-1", "1.5", "99999999999999999999999"])
def test_a_malformed_turn_id_is_a_400_or_404_never_a_500(api: Client, turn_id: str) -> None:
    response = api.get(f"/api/v1/turns/{turn_id}")
    assert response.status_code in (400, 404)


def test_cancel_a_queued_turn_then_again_is_a_409(api: Client, agent: Agent) -> None:
    turn_id = post(
        api, "/api/v1/agents/ada/turns", {"messages": [{"participant": "alice", "content": "one"}]}
    ).json()["id"]
    response = post(api, f"/api/v1/turns/{turn_id}/cancel", {})
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    assert post(api, f"/api/v1/turns/{turn_id}/cancel", {}).status_code == 409
