"""Providers keep the server's secrets and network to themselves (API.md, Providers): an
allowed key variable only, no credentials or forbidden addresses in base_url, checked at
creation and again before every call; non-operator tokens see names and kinds only."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent, Provider
from inference.models import InferenceCall, Turn
from tests.conftest import wait_for
from tests.factories import AgentFactory, ProviderFactory

pytestmark = pytest.mark.django_db


def create(api: Client, **fields: Any) -> Any:
    body = {"name": "prov", "kind": "openai", "base_url": "http://127.0.0.1:9/v1", **fields}
    return api.post("/api/v1/providers", data=json.dumps(body), content_type="application/json")


def refused(response: Any, field: str, words: str) -> None:
    assert response.status_code == 400, response.content
    assert response.json()["data"]["field"] == field
    assert words in response.json()["message"], response.json()
    assert not Provider.objects.exists()


# --- at creation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["DATABASE_URL", "DJANGO_SECRET_KEY", "REDIS_URL", "HOME", "OPENAI_API_KEYS"]
)
def test_a_key_variable_outside_the_allowlist_is_refused(api: Client, name: str) -> None:
    refused(create(api, api_key_env=name), "api_key_env", "AGENTOPS_PROVIDER_KEY_ENVS")


def test_names_ending_in_api_key_are_allowed_and_the_allowlist_is_the_operators(
    api: Client, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OPENAI_API_KEY", "VENDOR_KEY", "LLM_TOKEN", "ANTHROPIC_API_KEY"):
        monkeypatch.setenv(name, "sk-test")
    assert create(api, api_key_env="OPENAI_API_KEY").status_code == 201
    settings.AGENTOPS_PROVIDER_KEY_ENVS = "LLM_TOKEN, VENDOR_*"
    assert create(api, name="p2", api_key_env="VENDOR_KEY").status_code == 201
    assert create(api, name="p3", api_key_env="LLM_TOKEN").status_code == 201
    response = create(api, name="p4", api_key_env="ANTHROPIC_API_KEY")
    assert response.status_code == 400 and response.json()["data"]["field"] == "api_key_env"


@pytest.mark.parametrize("value", [None, ""])
def test_a_key_variable_that_is_not_set_here_is_refused_naming_it(
    api: Client, monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    # Its calls would go out with no Authorization header at all.
    if value is None:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    else:
        monkeypatch.setenv("OPENAI_API_KEY", value)
    refused(
        create(api, api_key_env="OPENAI_API_KEY"),
        "api_key_env",
        "OPENAI_API_KEY is not set in the service's environment",
    )


def test_a_host_name_is_not_resolved_at_creation(
    api: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DNS does not answer where the provider is created (as on a machine with no network):
    # every call checks the address anyway.
    def no_dns(*args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(-3, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert (
        create(api, base_url="https://api.openai.com/v1", api_key_env="OPENAI_API_KEY").status_code
        == 201
    )


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://169.254.169.254/latest/meta-data/", "cloud-metadata"),
        ("http://169.254.1.1/", "link-local"),
        ("http://[fe80::1]/", "link-local"),
        ("http://[::ffff:169.254.169.254]/", "link-local"),
        ("http://0.0.0.0:5432/", "unspecified"),
        ("http://224.0.0.1/", "multicast"),
        ("http://240.0.0.1/", "reserved"),
        ("http://user:secret@127.0.0.1:9/v1", "credentials"),
        ("http://key@127.0.0.1:9/v1", "credentials"),
        ("ftp://127.0.0.1/", "must be an http:// or https:// URL"),
    ],
)
def test_a_base_url_the_policy_never_allows_is_refused_even_with_private_allowed(
    api: Client, url: str, words: str, settings: Any
) -> None:
    settings.AGENTOPS_PROVIDERS_ALLOW_PRIVATE = True
    refused(create(api, base_url=url), "base_url", words)


@pytest.mark.parametrize(
    "url",
    ["http://127.0.0.1:5432/", "http://10.0.0.5/v1", "http://[::1]:6379/", "http://192.168.1.10/"],
)
def test_private_and_loopback_addresses_need_the_setting(
    api: Client, url: str, settings: Any
) -> None:
    settings.AGENTOPS_PROVIDERS_ALLOW_PRIVATE = False
    refused(create(api, base_url=url), "base_url", "AGENTOPS_PROVIDERS_ALLOW_PRIVATE=true")
    settings.AGENTOPS_PROVIDERS_ALLOW_PRIVATE = True
    assert create(api, base_url=url).status_code == 201


def test_only_operators_see_where_a_provider_points_and_which_variable_it_reads(
    api: Client, user_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    assert create(api, api_key_env="OPENAI_API_KEY").status_code == 201
    user = Client(headers={"Authorization": f"Bearer {user_token}"})
    assert user.get("/api/v1/providers").json() == [
        {"name": "prov", "kind": "openai", "base_url": None, "api_key_env": None}
    ]
    assert api.get("/api/v1/providers").json() == [
        {
            "name": "prov",
            "kind": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "api_key_env": "OPENAI_API_KEY",
        }
    ]


# --- before each call ---------------------------------------------------------------------


def complete(api: Client, agent: str) -> Any:
    body = {"messages": [{"participant": "alice", "content": "hi"}]}
    return api.post(
        f"/api/v1/agents/{agent}/complete", data=json.dumps(body), content_type="application/json"
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"api_key_env": "DATABASE_URL"}, "api_key_env"),
        ({"base_url": "http://169.254.169.254/v1"}, "cloud-metadata"),
    ],
)
def test_a_provider_row_that_breaks_the_policy_is_refused_at_call_time_without_a_request(
    api: Client, standin: str, standin_requests: Any, fields: dict[str, str], words: str
) -> None:
    # Written past the API (an old row, or the database edited by hand): the worker checks again.
    provider = ProviderFactory.create(
        name="old", kind="openai", **{"base_url": f"{standin}/v1", "api_key_env": "", **fields}
    )
    agent: Agent = AgentFactory.create(provider=provider, model="answer")
    response = complete(api, agent.name)
    assert response.status_code == 502, response.content
    error = response.json()["data"]
    assert "provider policy" in response.json()["message"] and words in response.json()["message"]
    assert (error.get("type"), error.get("provider_code"), error.get("retryable")) == (
        "auth",
        "provider_refused",
        False,
    )
    assert standin_requests() == []
    call = InferenceCall.objects.get()
    assert call.outcome == "error" and call.ended_at is not None  # recorded like any ended call


@pytest.mark.django_db(transaction=True)
def test_a_setting_changed_after_creation_is_honoured_at_the_next_call(
    api: Client, standin: str, standin_requests: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STANDIN_API_KEY", "sk-standin")
    assert (
        create(api, name="sp", base_url=f"{standin}/v1", api_key_env="STANDIN_API_KEY").status_code
        == 201
    )
    agent: Agent = AgentFactory.create(provider=Provider.objects.get(name="sp"), model="answer")
    assert complete(api, agent.name).status_code == 200
    sent = standin_requests()
    assert len(sent) == 1
    settings.AGENTOPS_PROVIDERS_ALLOW_PRIVATE = False
    response = complete(api, agent.name)
    assert (
        response.status_code == 502
        and "AGENTOPS_PROVIDERS_ALLOW_PRIVATE" in response.json()["message"]
    )
    assert len(standin_requests()) == 1


NAME = "provider.example.test"


@pytest.mark.django_db(transaction=True)
def test_a_call_connects_to_the_checked_address_with_the_name_in_the_host_header(
    api: Client, standin: str, standin_requests: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DNS faked at the process edge: the name answers the stand-in's loopback address for the
    # check, then an address where nothing listens (a rebinding). The call must go where the
    # check looked, once, with the name in the Host header.
    lookups: list[str] = []
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != NAME:
            return real_getaddrinfo(host, port, *args, **kwargs)
        lookups.append(host)
        address = "127.0.0.1" if len(lookups) == 1 else "127.0.0.2"
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, int(port)))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    by_name = standin.replace("127.0.0.1", NAME)
    provider = ProviderFactory.create(name="named", kind="openai", base_url=f"{by_name}/v1")
    agent: Agent = AgentFactory.create(provider=provider, model="answer")
    response = complete(api, agent.name)
    assert response.status_code == 200, response.content
    assert lookups == [NAME]
    [sent] = standin_requests()
    headers = {k.lower(): v for k, v in sent["headers"].items()}
    assert headers["host"] == by_name.removeprefix("http://")


@pytest.mark.django_db(transaction=True)
def test_a_call_whose_key_variable_went_missing_is_an_auth_error_without_a_request(
    api: Client,
    standin: str,
    standin_requests: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(
        "GONE_API_KEY", raising=False
    )  # set when the provider was created, unset since
    provider = ProviderFactory.create(
        name="keyless", kind="openai", base_url=f"{standin}/v1", api_key_env="GONE_API_KEY"
    )
    agent: Agent = AgentFactory.create(provider=provider, model="answer")
    response = complete(api, agent.name)
    assert response.status_code == 502, response.content
    error = response.json()["data"]
    assert error["type"] == "auth" and "GONE_API_KEY is not set" in error["message"]
    assert standin_requests() == []


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("workers")
def test_a_turn_whose_provider_is_refused_at_call_time_fails_cleanly_with_the_reason(
    api: Client, standin: str, standin_requests: Any
) -> None:
    provider = ProviderFactory.create(
        name="leaky", kind="openai", base_url=f"{standin}/v1", api_key_env="DATABASE_URL"
    )
    agent: Agent = AgentFactory.create(provider=provider, model="answer")
    body = {"messages": [{"participant": "alice", "content": "hi"}]}
    turn_id = api.post(
        f"/api/v1/agents/{agent.name}/turns", data=json.dumps(body), content_type="application/json"
    ).json()["id"]
    turn = wait_for(
        lambda: (
            (t := api.get(f"/api/v1/turns/{turn_id}").json())["status"]
            in ("failed", "succeeded", "exhausted")
            and t
        ),
        timeout=30,
        what="the turn to end",
    )
    assert turn["status"] == "failed", turn
    assert turn["error"]["type"] == "auth" and "api_key_env" in turn["error"]["message"]
    assert [c["outcome"] for c in turn["calls"]] == ["error"] and turn["calls"][0][
        "ended_at"
    ] is not None
    assert standin_requests() == []
    assert Turn.objects.get().ended_at is not None
