"""The window fields of an agent (architecture.md §5.9): set on POST and PATCH /agents, refused
with a 400 naming the field and nothing changed, shown as ``context`` on GET /agents/{name}."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent
from inference.models import InferenceCall
from tests.factories import AgentFactory, ProviderFactory
from turns.runtime import TurnRuntime

pytestmark = pytest.mark.django_db

GOOD = {"name": "bob", "kind": "resident", "provider": "p1", "model": "answer"}


def post(client: Client, url: str, body: Any) -> Any:
    return client.post(url, data=json.dumps(body), content_type="application/json")


def patch(client: Client, url: str, body: Any) -> Any:
    return client.patch(url, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def provider() -> Any:
    return ProviderFactory(name="p1")


@pytest.mark.parametrize(
    ("kind", "policy"), [("resident", "trim"), ("conversation", "fail"), ("ephemeral", "fail")]
)
def test_residents_trim_by_default_and_the_others_fail_as_they_did(
    api: Client, provider: Any, kind: str, policy: str
) -> None:
    response = post(api, "/api/v1/agents", {**GOOD, "kind": kind})
    assert response.status_code == 201, response.content
    assert response.json()["context"] == {
        "window": None,
        "learned": None,
        "last_input_tokens": None,
        "used_fraction": None,
        "policy": policy,
    }


def test_window_and_policy_are_set_patched_and_shown(api: Client, provider: Any) -> None:
    body = {**GOOD, "context_window": 16000, "context_policy": "summarize", "max_tokens": 1000}
    assert post(api, "/api/v1/agents", body).status_code == 201
    agent = Agent.objects.get(name="bob")
    assert (agent.context_window, agent.context_policy) == (16000, "summarize")
    InferenceCall.objects.create(agent=agent, model="answer", streamed=True, input_tokens=4000)
    context = api.get("/api/v1/agents/bob").json()["context"]
    assert context["window"] == 16000 and context["last_input_tokens"] == 4000
    assert context["used_fraction"] == 0.25
    response = patch(api, "/api/v1/agents/bob", {"context_window": 8000, "context_policy": "fail"})
    assert response.status_code == 200, response.content
    assert response.json()["context"]["window"] == 8000
    assert response.json()["context"]["policy"] == "fail"
    assert response.json()["context"]["used_fraction"] == 0.5
    # The learned window binds when smaller.
    Agent.objects.filter(pk=agent.pk).update(context_learned_window=5000)
    listed = api.get("/api/v1/agents").json()["items"]
    assert listed[0]["context"]["learned"] == 5000 and listed[0]["context"]["used_fraction"] == 0.8
    # null clears the configured window.
    assert patch(api, "/api/v1/agents/bob", {"context_window": None}).status_code == 200
    assert Agent.objects.get(name="bob").context_window is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("context_window", 0),
        ("context_window", 255),
        ("context_window", "16000"),
        ("context_window", 1.5),
        ("context_window", 200_000_000),
        ("context_window", 1000),  # not larger than max_tokens
        ("context_policy", "truncate"),
        ("context_policy", 1),
    ],
)
def test_a_bad_window_or_policy_is_a_400_naming_it_and_nothing_is_made(
    api: Client, provider: Any, field: str, value: Any
) -> None:
    response = post(api, "/api/v1/agents", {**GOOD, "max_tokens": 1000, field: value})
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == field
    assert not Agent.objects.filter(name="bob").exists()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("context_window", 100),
        ("context_window", 500),  # not larger than max_tokens
        ("context_policy", None),
        ("context_policy", "compact"),
    ],
)
def test_a_bad_patch_is_a_400_naming_it_and_nothing_changes(
    api: Client, provider: Any, field: str, value: Any
) -> None:
    agent = AgentFactory.create(name="bob", provider=provider, max_tokens=500, context_window=9000)
    response = patch(api, "/api/v1/agents/bob", {field: value})
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == field
    agent.refresh_from_db()
    assert (agent.context_window, agent.context_policy) == (9000, "trim")


def test_lowering_max_tokens_past_the_window_is_refused_naming_the_window(
    api: Client, provider: Any
) -> None:
    AgentFactory.create(name="bob", provider=provider, max_tokens=500, context_window=9000)
    response = patch(api, "/api/v1/agents/bob", {"max_tokens": 9000})
    assert response.status_code == 400
    assert response.json()["data"]["field"] == "context_window"
    assert Agent.objects.get(name="bob").max_tokens == 500


def test_the_admin_agent_page_shows_the_window_and_refuses_a_window_below_max_tokens(
    provider: Any,
) -> None:
    from django.contrib.auth.models import User

    agent = AgentFactory.create(name="bob", provider=provider, max_tokens=500, context_window=9000)
    Agent.objects.filter(pk=agent.pk).update(context_learned_window=8000)
    InferenceCall.objects.create(agent=agent, model="answer", streamed=True, input_tokens=2000)
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    page = client.get(f"/admin/agentops/agent/{agent.pk}/change/").content.decode()
    assert "window 9000 · learned 8000 · last input 2000 tokens · used 25% · policy trim" in page
    form = client.get(f"/admin/agentops/agent/{agent.pk}/change/").context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k != "tools"}
    data.update(
        provider=provider.pk, project=agent.project_id, tools="[]", context_window=400, stream="on"
    )
    response = client.post(f"/admin/agentops/agent/{agent.pk}/change/", data)
    assert response.status_code == 200  # the form again, with the error
    assert "must be larger than max_tokens" in response.content.decode()
    assert Agent.objects.get(pk=agent.pk).context_window == 9000


def test_a_row_set_aside_for_the_window_is_restored_from_the_admin_with_an_audit_row(
    provider: Any,
) -> None:
    from django.contrib.auth.models import User
    from django.utils import timezone

    from agentops.models import AuditEntry, HistoryRow
    from breaker.shedding import history_set_aside

    agent = AgentFactory.create(name="bob", provider=provider)
    row = HistoryRow.objects.create(
        agent=agent, seq=1, participant="alice", role="user", content="x"
    )
    history_set_aside(row_ids=[row.pk], by="context", reason="context", now=timezone.now())
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    listing = client.get("/admin/agentops/historyrow/").content.decode()
    assert "context" in listing
    response = client.post(
        "/admin/agentops/historyrow/",
        {
            "action": "restore",
            "_selected_action": [row.pk],
            "confirmed": "yes",
            "reason": "the window is larger now",
        },
    )
    assert response.status_code == 302
    row.refresh_from_db()
    assert row.state == "presented" and row.set_aside_reason == ""
    [audit] = AuditEntry.objects.filter(action="history.restore")
    assert audit.data["set_aside_reason"] == "context" and audit.data["set_aside_by"] == "context"


def test_the_dashboard_shows_a_context_bar_per_agent(runtime: TurnRuntime, provider: Any) -> None:
    from interfaces.dashboard import dashboard_snapshot
    from waits.clock import clock_ms

    agent = AgentFactory.create(name="bob", provider=provider, context_window=16000)
    AgentFactory.create(name="cid", provider=provider)
    InferenceCall.objects.create(agent=agent, model="answer", streamed=True, input_tokens=12000)
    bars = {
        b["agent"]: b["context"]
        for b in dashboard_snapshot(runtime.pacer, now_ms=clock_ms())["breakers"]
    }
    assert bars == {
        "bob": {"window": 16000, "last_input_tokens": 12000, "used_fraction": 0.75},
        "cid": {"window": None, "last_input_tokens": None, "used_fraction": None},
    }


def test_a_calls_error_shows_the_window_a_refusal_stated(api: Client, provider: Any) -> None:
    from tests.factories import TurnFactory

    agent = AgentFactory.create(name="bob", provider=provider)
    turn = TurnFactory.create(agent=agent, status="failed")
    error = {
        "type": "context_length",
        "http_status": 400,
        "provider_code": "context_length_exceeded",
        "message": "This model's maximum context length is 16000 tokens. ...",
        "retryable": False,
        "retry_after_ms": None,
        "until_released": False,
        "context_limit": 16000,
    }
    InferenceCall.objects.create(
        agent=agent, turn=turn, model="answer", streamed=True, outcome="error", error=error
    )
    [call] = api.get(f"/api/v1/turns/{turn.pk}").json()["calls"]
    assert call["error"]["context_limit"] == 16000


# An alternate's window is held to the agent's own rules (architecture.md §6.11): the same
# answer, max_tokens long, goes to whichever model serves.
ALTERNATE_OK = {"provider": "p1", "model": "alt-ok", "context_window": 1001}


@pytest.mark.parametrize("window", [10, 255, 1000, 200_000_000, "16000"])
def test_an_alternates_bad_window_is_a_400_naming_it_and_nothing_is_made(
    api: Client, provider: Any, window: Any
) -> None:
    alternates = [ALTERNATE_OK, {"provider": "p1", "model": "alt", "context_window": window}]
    body = {**GOOD, "max_tokens": 1000, "fallbacks": alternates}
    response = post(api, "/api/v1/agents", body)
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == "fallbacks[1].context_window"
    assert not Agent.objects.filter(name="bob").exists()
    made = post(api, "/api/v1/agents", {**body, "fallbacks": [ALTERNATE_OK]})
    assert made.status_code == 201, made.content
    assert made.json()["fallbacks"][0]["context_window"] == 1001


def test_an_alternates_window_below_max_tokens_is_refused_on_patch_either_way_round(
    api: Client, provider: Any
) -> None:
    AgentFactory.create(name="bob", provider=provider, max_tokens=100)
    small = [{"provider": "p1", "model": "x", "context_window": 10}]
    response = patch(api, "/api/v1/agents/bob", {"fallbacks": small})
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == "fallbacks[0].context_window"
    assert Agent.objects.get(name="bob").fallbacks == []
    fits = [{"provider": "p1", "model": "x", "context_window": 300}]
    assert patch(api, "/api/v1/agents/bob", {"fallbacks": fits}).status_code == 200
    # A max_tokens the alternate's window cannot hold is refused too, naming that window.
    response = patch(api, "/api/v1/agents/bob", {"max_tokens": 300})
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == "fallbacks[0].context_window"
    assert Agent.objects.get(name="bob").max_tokens == 100


def test_the_admin_refuses_an_alternates_window_below_max_tokens(provider: Any) -> None:
    from django.contrib.auth.models import User

    agent = AgentFactory.create(name="bob", provider=provider, max_tokens=500)
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    form = client.get(f"/admin/agentops/agent/{agent.pk}/change/").context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k != "tools"}
    data.update(provider=provider.pk, project=agent.project_id, tools="[]", stream="on")
    for window, says in ((400, "must be larger than max_tokens (500)"), (10, "from 256")):
        alternates = json.dumps([{"provider": "p1", "model": "alt", "context_window": window}])
        response = client.post(
            f"/admin/agentops/agent/{agent.pk}/change/", {**data, "fallbacks": alternates}
        )
        assert response.status_code == 200  # the form again, with the error
        page = response.content.decode()
        assert "fallbacks[0].context_window" in page and says in page
        assert Agent.objects.get(pk=agent.pk).fallbacks == []
