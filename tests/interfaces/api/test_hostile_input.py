"""No input produces a 500 (issue: trust boundary): each hostile input found from outside
answers 4xx naming the field and changes nothing, and a release that cannot be stored leaves
the process's later acts working."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent, AuditEntry, HistoryRow
from inference.models import Turn
from tests.factories import AgentFactory, ProviderFactory
from waits.journal import journal_pending
from waits.models import WaitJournalEntry

pytestmark = pytest.mark.django_db


def call(c: Client, method: str, url: str, body: Any = None) -> Any:
    data = body if isinstance(body, str | bytes) else "" if body is None else json.dumps(body)
    return c.generic(method, url, data, content_type="application/json")


@pytest.fixture
def agent() -> Agent:
    made: Agent = AgentFactory.create(name="ada", provider=ProviderFactory(name="p1"), model="m1")
    return made


@pytest.fixture
def user(user_token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {user_token}"})


def assert_bad(response: Any, field: str, words: str) -> None:
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["code"] == "bad_request" and body["data"]["field"] == field, body
    assert words in body["message"], body


# --- NUL and other unstorable text in the path and the query ---------------------------------

PATHS = [
    ("GET", "/api/v1/agents/a%00b", None),
    ("PATCH", "/api/v1/agents/a%00b", {"model": "m"}),
    ("DELETE", "/api/v1/agents/a%00b", None),
    ("GET", "/api/v1/agents/a%00b/history", None),
    ("GET", "/api/v1/agents/a%00b/breaker", None),
    (
        "POST",
        "/api/v1/agents/a%00b/turns",
        {"messages": [{"participant": "alice", "content": "x"}]},
    ),
    (
        "POST",
        "/api/v1/agents/a%00b/complete",
        {"messages": [{"participant": "alice", "content": "x"}]},
    ),
    ("POST", "/api/v1/agents/a%00b/history/1/restore", None),
    ("GET", "/api/v1/agents/%ED%A0%80", None),  # the UTF-8 bytes of a lone surrogate
    ("GET", "/api/v1/agents/a%C2%85b", None),  # a C1 control
    ("GET", "/api/v1/turns/99999999999999999999999", None),  # past bigint
    ("POST", "/api/v1/turns/99999999999999999999999/cancel", None),
    ("POST", "/api/v1/alerts/99999999999999999999999/acknowledge", None),
    ("POST", "/api/v1/agents/ada/history/99999999999999999999999/restore", None),
]


@pytest.mark.django_db(transaction=True)  # async views read in the runtime's own threads
@pytest.mark.parametrize("who", ["operator", "user"])
@pytest.mark.parametrize(("method", "url", "body"), PATHS)
def test_a_path_that_names_nothing_storable_is_a_4xx_with_any_token(
    api: Client, user: Client, agent: Agent, who: str, method: str, url: str, body: Any
) -> None:
    response = call(api if who == "operator" else user, method, url, body)
    # 404 (no such agent), or 403 for a non-operator on an operator endpoint: never a 500
    assert response.status_code in (403, 404), (response.status_code, response.content)
    assert response.json()["code"] in ("not_found", "forbidden")
    assert Agent.objects.get(name="ada").model == "m1"


@pytest.mark.parametrize(
    "url",
    [
        "/api/v1/waits/journal?agent=%00",
        "/api/v1/waits?agent=%00",
        "/api/v1/waits?model=a%E2%80%AEb",
        "/api/v1/alerts?agent=%00",
    ],
)
def test_a_query_parameter_with_nul_or_a_control_is_a_400_naming_it(api: Client, url: str) -> None:
    response = api.get(url)
    field = "model" if "model=" in url else "agent"
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == field


# --- bodies -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "field"),
    [
        ({"name": "t", "description": "a\x00b"}, "tools[0].description"),
        (
            {"name": "t", "input_schema": {"type": "object", "properties": {"a\x00": {}}}},
            "tools[0].input_schema",
        ),
        (
            {"name": "t", "input_schema": {"type": "object", "description": "\ud800"}},
            "tools[0].input_schema",
        ),
    ],
)
def test_a_tool_with_nul_or_a_lone_surrogate_is_a_400_and_no_agent(
    api: Client, tool: dict[str, Any], field: str
) -> None:
    ProviderFactory(name="p1")
    response = call(
        api,
        "POST",
        "/api/v1/agents",
        {"name": "t1", "provider": "p1", "model": "m", "tools": [tool]},
    )
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == field
    assert not Agent.objects.filter(name="t1").exists()


@pytest.mark.django_db(transaction=True)  # async views read in the runtime's own threads
@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ("al\u0085ice", "control characters"),  # C1 NEXT LINE
        ("al\u009bice", "control characters"),  # C1 CSI
        ("al\u202eice", "bidirectional"),  # RIGHT-TO-LEFT OVERRIDE
        ("al\u2066ice", "bidirectional"),  # LEFT-TO-RIGHT ISOLATE
        ("al\u2028ice", "line or paragraph separators"),
        ("al\u2029ice", "line or paragraph separators"),
        ("al\x00ice", "NUL"),
        ("al\ud800ice", "lone surrogates"),
        ("al\nice", "control characters"),
    ],
)
@pytest.mark.parametrize("endpoint", ["turns", "complete"])
def test_a_participant_name_with_controls_bidi_or_separators_is_a_400(
    user: Client, user_token: str, endpoint: str, bad: str, words: str
) -> None:
    ProviderFactory(name="p1")
    assert (
        call(
            user, "POST", "/api/v1/agents", {"name": "ada", "provider": "p1", "model": "m"}
        ).status_code
        == 201
    )
    response = call(
        user,
        "POST",
        f"/api/v1/agents/ada/{endpoint}",
        {"messages": [{"participant": bad, "content": "hi"}]},
    )
    assert_bad(response, "messages[0].participant", words)
    assert not HistoryRow.objects.exists() and not Turn.objects.exists()


def test_message_content_keeps_newlines_and_bidi_but_not_nul_or_surrogates(
    api: Client, agent: Agent
) -> None:
    ok = call(
        api,
        "POST",
        "/api/v1/agents/ada/turns",
        {"messages": [{"participant": "alice", "content": "one\ntwo \u202e three"}]},
    )
    assert ok.status_code == 202, ok.content
    for bad in ("a\x00b", "a\ud800b", "a\x85b"):
        response = call(
            api,
            "POST",
            "/api/v1/agents/ada/turns",
            {"messages": [{"participant": "alice", "content": bad}]},
        )
        assert_bad(response, "messages[0].content", "must not contain")
    assert HistoryRow.objects.count() == 1


@pytest.mark.parametrize(
    "url", ["/api/v1/waits/release", "/api/v1/agents", "/api/v1/agents/ada/history/1/restore"]
)
def test_json_nested_ten_thousand_deep_is_a_400(api: Client, agent: Agent, url: str) -> None:
    deep = "[" * 10_000 + "]" * 10_000
    response = call(api, "POST", url, '{"agent": "ada", "reason": ' + deep + "}")
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == "body"


def test_json_nested_past_the_limit_but_parseable_is_a_400_for_a_release(
    api: Client, agent: Agent
) -> None:
    response = call(
        api,
        "POST",
        "/api/v1/waits/release",
        '{"agent": "ada", "reason": ' + "[" * 100 + "]" * 100 + "}",
    )
    assert_bad(response, "body", "deeper than 32 levels")
    assert not WaitJournalEntry.objects.exists()


def test_a_body_over_the_limit_is_a_413(api: Client, agent: Agent) -> None:
    content = "x" * (1024 * 1024 + 10)
    response = call(
        api,
        "POST",
        "/api/v1/agents/ada/turns",
        {"messages": [{"participant": "alice", "content": content}]},
    )
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"


# --- a release that cannot be stored leaves the process working ----------------------------


@pytest.mark.parametrize("field", ["requester", "reason"])
def test_a_lone_surrogate_in_a_release_is_a_400_and_later_acts_still_work_in_this_process(
    api: Client, agent: Agent, field: str
) -> None:
    raw = '{"agent": "ada", "model": "m1", "' + field + '": "ops \\ud800"}'
    response = call(api, "POST", "/api/v1/waits/release", raw)
    assert_bad(response, field, "lone surrogates")
    assert (
        journal_pending() == []
        and not WaitJournalEntry.objects.exists()
        and not AuditEntry.objects.exists()
    )
    # the same process: the waits list, a normal release and a completion's lookup still answer
    assert api.get("/api/v1/waits").status_code == 200
    released = call(
        api,
        "POST",
        "/api/v1/waits/release",
        {"agent": "ada", "model": "m1", "requester": "ops", "reason": "ok"},
    )
    assert released.status_code == 200, released.content
    assert journal_pending() == []
    assert list(WaitJournalEntry.objects.values_list("kind", "reason")) == [("release", "ok")]
    assert api.get("/api/v1/waits").status_code == 200


def test_the_api_records_the_calling_token_as_the_actor_and_the_requester_as_data(
    api: Client, agent: Agent
) -> None:
    call(
        api,
        "POST",
        "/api/v1/waits/release",
        {"agent": "ada", "requester": "someone else", "reason": "recovered"},
    )
    entry = AuditEntry.objects.get(action="wait.release")
    assert entry.actor == "api:test-operator"
    assert entry.data["requester"] == "someone else" and entry.reason == "recovered"
    row = WaitJournalEntry.objects.get(kind="release")
    assert (row.by, row.reason) == ("api:test-operator", "recovered")


# --- the turn message cap ---------------------------------------------------------------------


def test_joining_a_queued_turn_stops_at_100_messages_in_all_with_a_409_and_the_count(
    api: Client, agent: Agent
) -> None:
    def messages(n: int) -> dict[str, Any]:
        return {"messages": [{"participant": "alice", "content": f"m{i}"} for i in range(n)]}

    first = call(api, "POST", "/api/v1/agents/ada/turns", messages(60))
    assert first.status_code == 202, first.content
    joined = call(api, "POST", "/api/v1/agents/ada/turns", messages(40))
    assert joined.status_code == 202 and joined.json()["joined"] is True
    over = call(api, "POST", "/api/v1/agents/ada/turns", messages(1))
    assert over.status_code == 409, over.content
    assert over.json()["data"] == {
        "field": "messages",
        "turn": first.json()["id"],
        "count": 100,
        "adding": 1,
        "limit": 100,
    }
    assert "100" in over.json()["message"]
    turn = Turn.objects.get()
    assert turn.trigger_rows.count() == 100 and HistoryRow.objects.count() == 100


# --- the OpenAPI document states the rules ------------------------------------------------


def test_the_openapi_document_states_enums_patterns_limits_and_the_400_and_413_answers(
    api: Client,
) -> None:
    doc = api.get("/api/v1/openapi.json").json()
    schemas = doc["components"]["schemas"]
    call = schemas["CallOut"]["properties"]
    assert set(schemas[call["kind"]["$ref"].split("/")[-1]]["enum"]) == {
        "primary",
        "auxiliary",
        "probe",
    }
    assert {"completed", "cut", "error", "aborted", "deferred"} <= set(
        schemas[call["outcome"]["anyOf"][0]["$ref"].split("/")[-1]]["enum"]
    )
    assert "whole_call" in schemas[call["bound"]["anyOf"][0]["$ref"].split("/")[-1]]["enum"]
    status = schemas["TurnOut"]["properties"]["status"]["$ref"].split("/")[-1]
    assert {
        "queued",
        "running",
        "held",
        "requires_action",
        "succeeded",
        "failed",
        "cancelled",
    } <= set(schemas[status]["enum"])
    participant = schemas["MessageIn"]["properties"]["participant"]
    assert (
        participant["maxLength"] == 100
        and "\\u202a-\\u202e" in participant["pattern"]
        and "\\x00" in participant["pattern"]
    )
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            if path.endswith("/health"):
                continue
            assert {"400", "401"} <= set(operation["responses"]), (method, path)
            if method in ("post", "patch"):
                assert "413" in operation["responses"], (method, path)
