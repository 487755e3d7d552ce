"""A provider's words never carry a key (architecture.md §15): a provider on another loopback
host (``tests.keyecho``) echoes the key it was sent every way it can (``authorization: Bearer
<key>`` and ``x-api-key: <key>`` in a 401's body, the key bare and masked, another provider's
key, the key in its response headers, the same in a stream's error frame). Every surface a
tenant, an operator or another provider sees is checked: ``/complete``'s 502, the three
drop-ins' error bodies and error events, a turn's ``error`` and its ``[inference-failed]``
note, the request a later turn sends to an alternate on another host, the processes' logs,
``failures.log``, alerts and webhooks. After each test every row of every table, every log and
every request another host received is searched for the keys: the key appears only in the
request headers its own provider was sent."""

from __future__ import annotations

import importlib
import json
import shutil
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from django.apps import apps
from django.core import serializers
from django.db.models import F
from django.test import Client, override_settings

from agentops.models import Agent, Alert, HistoryRow, Provider
from tests.agentops.live_asgi import asgi_server
from tests.agentops.webhooks.conftest import Receiver
from tests.conftest import LOG_DIR, WorkerPool, server_process, wait_for, worker_pool
from tests.factories import (
    AgentFactory,
    AlertFactory,
    CallFactory,
    HistoryRowFactory,
    ProviderFactory,
    TurnFactory,
    WebhookDeliveryFactory,
    WebhookEndpointFactory,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

# The canary: this provider's key. OTHER is another provider's, which the echoing gateway
# also knows. Each leaks if any run of its first 12 characters shows anywhere.
CANARY = "sk-canary-7f3a9c1e5b2d4f6a8c0e1234"
OTHER = "sk-other-9e8d7c6b5a4f3e2d1c0b5678"
KEYS_ENV = {"CANARY_API_KEY": CANARY, "OTHER_API_KEY": OTHER}
LOGS = LOG_DIR / "keys"
DOWN_AFTER_MS = 300
SERVICE_ENV = {
    **KEYS_ENV,
    "AGENTOPS_PROVIDER_DOWN_AFTER_MS": str(DOWN_AFTER_MS),
    "AGENTOPS_WEBHOOKS_ALLOW_PRIVATE": "true",
}


def leaked(text: str | bytes) -> list[str]:
    """Which keys ``text`` shows (whole, or their first 12 characters)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return [key for key in (CANARY, OTHER) if key[:12] in text]


@pytest.fixture(scope="module", autouse=True)
def keys_in_environment() -> Iterator[None]:
    """The keys in this process's environment too: ``/complete`` runs here."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in KEYS_ENV.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def keyecho() -> Iterator[str]:
    """The echoing provider on 127.0.0.2: another host than the stand-in's 127.0.0.1."""
    yield from server_process(
        "tests.keyecho",
        "keyecho",
        "--host",
        "127.0.0.2",
        "--port",
        "0",
        env={"KEYECHO_ALSO": OTHER},
    )


@pytest.fixture(scope="module")
def key_workers(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    # An earlier run's logs are not this run's.
    shutil.rmtree(LOGS, ignore_errors=True)
    for old in LOG_DIR.glob("keys*.log"):
        old.unlink()
    LOGS.mkdir(parents=True)
    env = {**SERVICE_ENV, "AGENTOPS_FAILURES_LOG": str(LOGS / "worker-failures.log")}
    yield from worker_pool(1, label="keys", extra_env=env)


@pytest.fixture(scope="module")
def web(key_workers: WorkerPool) -> Iterator[str]:
    """The service's web process with the keys, its tasks going to this module's worker."""
    env = {
        **SERVICE_ENV,
        "AGENTOPS_FAILURES_LOG": str(LOGS / "web-failures.log"),
        "AGENTOPS_CELERY_QUEUE": key_workers.queue,
    }
    yield from asgi_server("keys", env)


@pytest.fixture
def echoed(keyecho: str, key_workers: WorkerPool) -> Callable[..., Agent]:
    """An agent on the echoing provider (of ``kind``), its key from CANARY_API_KEY; the
    provider's record of requests cleared."""
    key_workers.routed()
    httpx.delete(f"{keyecho}/_echo/requests")

    def make(kind: str = "openai", model: str = "echo-401", **fields: Any) -> Agent:
        base = keyecho if kind == "anthropic" else f"{keyecho}/v1"
        provider = ProviderFactory.create(
            name=f"echo-{kind}", kind=kind, base_url=base, api_key_env="CANARY_API_KEY"
        )
        agent: Agent = AgentFactory.create(provider=provider, model=model, **fields)
        return agent

    return make


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A webhook receiver for provider-down and hard-down alerts."""
    made = Receiver()
    WebhookEndpointFactory.create(url=made.url, kinds=["provider-down", "hard-down"])
    yield made
    made.close()


@pytest.fixture(autouse=True)
def nowhere_else(
    transactional_db: None,
    keyecho: str,
    standin: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> Iterator[None]:
    """After each test (before its tables are emptied): no key in any row of any table, any log of the test's processes,
    ``failures.log``, or a request another host received; in its own provider's requests,
    only in the credential header."""
    yield
    for model in apps.get_models():
        dump = serializers.serialize("json", model._default_manager.all())
        assert not leaked(dump), f"a key in {model._meta.label}: {dump[:2000]}"
    for log in [*LOGS.glob("*"), *LOG_DIR.glob("keys*.log"), *tmp_path.glob("**/*.log")]:
        assert not leaked(log.read_bytes()), f"a key in {log}"
    assert not leaked(caplog.text)
    for request in httpx.get(f"{standin}/_standin/requests").json():
        assert not leaked(json.dumps(request)), "a key sent to another host"
    for request in httpx.get(f"{keyecho}/_echo/requests").json():
        headers = {k.lower(): v for k, v in request["headers"].items()}
        own = {headers.pop("authorization", ""), headers.pop("x-api-key", "")}
        assert not leaked(request["body"]) and not leaked(json.dumps(headers))
        assert own & {f"Bearer {CANARY}", CANARY}, "the provider was sent its own key"


def complete(api: Client, agent: Agent) -> Any:
    body = {"messages": [{"participant": "alice", "content": "hi"}]}
    return api.post(
        f"/api/v1/agents/{agent.name}/complete",
        data=json.dumps(body),
        content_type="application/json",
    )


@override_settings(AGENTOPS_PROVIDER_DOWN_AFTER_MS=DOWN_AFTER_MS)
@pytest.mark.parametrize("kind", ["openai", "anthropic", "openai-responses"])
def test_complete_answers_the_refusal_and_the_provider_down_alert_without_the_key(
    api: Client, echoed: Any, receiver: Receiver, kind: str
) -> None:
    agent = echoed(kind)
    first = complete(api, agent)
    assert first.status_code == 502
    assert "[redacted]" in first.json()["message"] and not leaked(first.content), first.content
    # The episode has lasted the window (its start moved back by it): the next failure alerts.
    Provider.objects.filter(pk=agent.provider_id).update(
        failing_since=F("failing_since") - timedelta(milliseconds=DOWN_AFTER_MS)
    )
    assert complete(api, agent).status_code == 502
    (down,) = Alert.objects.filter(kind="provider-down")
    assert "[redacted]" in down.message and not leaked(down.message + json.dumps(down.data))
    (hook,) = wait_for(receiver.received, what="the provider-down webhook")
    assert b"[redacted]" in hook.body and not leaked(hook.body)
    provider = Provider.objects.get(pk=agent.provider_id)
    assert "[redacted]" in json.dumps(provider.last_failure)


DROPIN_PATHS = {
    "openai": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "openai-responses": "/v1/responses",
}


def dropin_body(kind: str, agent: Agent, *, stream: bool) -> dict[str, Any]:
    said = [{"role": "user", "content": "hi"}]
    if kind == "openai-responses":
        return {"model": agent.name, "input": said, "stream": stream}
    return {"model": agent.name, "messages": said, "max_tokens": 64, "stream": stream}


def test_the_drop_ins_relay_the_refusal_without_the_key_through_the_sdks(
    web: str, user_token: str, echoed: Any
) -> None:
    oai = openai.OpenAI(base_url=f"{web}/v1", api_key=user_token, max_retries=0, timeout=30)
    ant = anthropic.Anthropic(base_url=web, api_key=user_token, max_retries=0, timeout=30)
    refusals = []
    with pytest.raises(openai.AuthenticationError) as chat:
        oai.chat.completions.create(
            model=echoed("openai").name, messages=[{"role": "user", "content": "hi"}]
        )
    refusals.append(chat.value.response)
    with pytest.raises(openai.AuthenticationError) as responses:
        oai.responses.create(model=echoed("openai-responses").name, input="hi")
    refusals.append(responses.value.response)
    with pytest.raises(anthropic.AuthenticationError) as messages:
        ant.messages.create(
            model=echoed("anthropic").name,
            max_tokens=64,
            messages=[{"role": "user", "content": "hi"}],
        )
    refusals.append(messages.value.response)
    for response in refusals:
        assert response.status_code == 401
        assert "[redacted]" in response.text and not leaked(response.text), response.text
        # A header the provider echoed the key in, passed on to the SDK.
        assert response.headers["x-request-id"] == "req-[redacted]"
    assert "x-api-key: [redacted]" in refusals[2].text  # Anthropic's form of the echo
    oai.close()
    ant.close()


@pytest.mark.parametrize("kind", ["openai", "anthropic", "openai-responses"])
def test_a_streamed_drop_in_relays_the_error_frame_without_the_key(
    web: str, user_token: str, echoed: Any, kind: str
) -> None:
    agent = echoed(kind, model="echo-frame")
    with httpx.stream(
        "POST",
        f"{web}{DROPIN_PATHS[kind]}",
        json=dropin_body(kind, agent, stream=True),
        headers={"authorization": f"Bearer {user_token}", "anthropic-version": "2023-06-01"},
        timeout=30,
    ) as response:
        relayed = response.read()
    assert b"error" in relayed and b"[redacted]" in relayed, relayed
    assert not leaked(relayed), relayed


@pytest.mark.parametrize(("kind", "model"), [("openai", "echo-401"), ("anthropic", "echo-frame")])
def test_a_turns_error_and_note_hold_no_key_nor_does_what_the_next_turn_sends_elsewhere(
    api: Client,
    echoed: Any,
    standin: str,
    providers: dict[str, Provider],
    kind: str,
    model: str,
) -> None:
    agent = echoed(kind, model=model)
    said = {"messages": [{"participant": "alice", "content": "hi"}]}
    turns = f"/api/v1/agents/{agent.name}/turns"
    first = api.post(turns, data=json.dumps(said), content_type="application/json").json()
    failed = wait_for(
        lambda: (
            (body := api.get(f"/api/v1/turns/{first['id']}").json())["status"] == "failed" and body
        ),
        what="the turn to fail",
    )
    assert "[redacted]" in failed["error"]["message"] and not leaked(json.dumps(failed))
    note = HistoryRow.objects.get(agent=agent, role=HistoryRow.Role.SYSTEM_NOTE)
    assert "[inference-failed]" in str(note.content) and "[redacted]" in str(note.content)

    # The tenant gives the agent an alternate on another host (the stand-in, on 127.0.0.1): the
    # primary refused its key, so the next turn goes there, its history and note with it.
    alternate = {"provider": providers[kind].name, "model": "answer"}
    patched = api.patch(
        f"/api/v1/agents/{agent.name}",
        data=json.dumps({"fallbacks": [alternate]}),
        content_type="application/json",
    )
    assert patched.status_code == 200, patched.content
    second = api.post(turns, data=json.dumps(said), content_type="application/json").json()
    wait_for(
        lambda: api.get(f"/api/v1/turns/{second['id']}").json()["status"] == "succeeded",
        what="the alternate to answer",
    )
    sent = json.dumps([r["body"] for r in httpx.get(f"{standin}/_standin/requests").json()])
    assert "[inference-failed]" in sent and "[redacted]" in sent, sent  # the note went, redacted


def test_the_migration_scrubs_keys_stored_before_from_notes_alerts_errors_and_deliveries(
    echoed: Any,
) -> None:
    """What the data migration ``agentops 0015_scrub_provider_keys`` does to rows written
    before redaction: the keys in its environment and the credential forms, wherever stored."""
    scrub = importlib.import_module("agentops.migrations.0015_scrub_provider_keys").scrub
    said = f"Incorrect API key provided: authorization: Bearer {CANARY}; also {OTHER[:14]}…"
    agent = echoed()
    note = HistoryRowFactory.create(
        agent=agent, role=HistoryRow.Role.SYSTEM_NOTE, content=f"[inference-failed] {said}"
    )
    told = HistoryRowFactory.create(agent=agent, content=f"my key is {CANARY}")
    alert = AlertFactory.create(message=said, data={"error": {"message": said}})
    turn = TurnFactory.create(agent=agent, error={"message": said})
    call = CallFactory.create(
        agent=agent, error={"message": said, "provider_code": "x-api-key: z1"}
    )
    delivery = WebhookDeliveryFactory.create(alert=alert, payload=json.dumps({"message": said}))
    Provider.objects.filter(pk=agent.provider_id).update(last_failure={"message": said})

    scrub(apps, None)

    for row, field in [
        (note, "content"),
        (alert, "message"),
        (alert, "data"),
        (turn, "error"),
        (call, "error"),
        (delivery, "payload"),
    ]:
        row.refresh_from_db()
        assert "[redacted]" in json.dumps(getattr(row, field)), (row, field)
    assert json.loads(delivery.payload)  # still the JSON it was
    assert (call.error or {})["provider_code"] == "x-api-key: [redacted]"
    told.refresh_from_db()
    assert told.content == f"my key is {CANARY}"  # a person's own words are theirs
    told.delete()
