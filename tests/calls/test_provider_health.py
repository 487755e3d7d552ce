"""A provider down (architecture.md §15): calls that all fail with network, TLS, auth or 5xx errors
for ``AGENTOPS_PROVIDER_DOWN_AFTER_MS`` raise one ``provider-down`` alert per episode (the row, the
dashboard's snapshot), and the first completed call ends the episode and says so."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F
from django.test import Client, override_settings

from agentops.models import Alert, Provider
from calls.health import provider_down_check
from interfaces.dashboard import dashboard_snapshot
from tests.conftest import WorkerPool, wait_for, worker_pool
from tests.factories import AgentFactory, ProviderFactory
from turns.runtime import TurnRuntime

pytestmark = [pytest.mark.django_db(transaction=True)]

REFUSED = "http://127.0.0.1:1/v1"  # nothing listens: every call is a network error


def complete(api: Client, agent: str) -> int:
    body = {"messages": [{"participant": "alice", "content": "hi"}]}
    return api.post(
        f"/api/v1/agents/{agent}/complete", data=json.dumps(body), content_type="application/json"
    ).status_code


@override_settings(AGENTOPS_PROVIDER_DOWN_AFTER_MS=300)
def test_a_provider_that_only_fails_raises_one_alert_per_episode_and_its_first_success_ends_it(
    runtime: TurnRuntime, api: Client, standin: str
) -> None:
    provider = ProviderFactory.create(name="flaky", kind="openai", base_url=REFUSED)
    agent = AgentFactory.create(provider=provider, model="answer")
    assert complete(api, agent.name) == 502
    assert not Alert.objects.filter(kind="provider-down").exists()  # one failure is no episode yet
    # The episode has lasted the setting (AGENTOPS_PROVIDER_DOWN_AFTER_MS, 300 ms): its start is
    # moved back by that much rather than waited for.
    Provider.objects.filter(pk=provider.pk).update(
        failing_since=F("failing_since") - timedelta(milliseconds=300)
    )
    assert complete(api, agent.name) == 502
    (down,) = Alert.objects.filter(kind="provider-down")
    assert (
        (down.agent, down.model) == ("provider:flaky", "*")
        and "every call for" in down.message
        and "could not be reached" in down.message
        and "HTTP None" not in down.message
        and REFUSED in down.message  # the address tried, for the operator the alert is for
    )
    assert down.data["provider"] == "flaky"
    assert complete(api, agent.name) == 502
    assert Alert.objects.filter(kind="provider-down").count() == 1  # one per episode
    assert [
        p["provider"]
        for p in dashboard_snapshot(runtime.pacer, now_ms=time.time() * 1000)["providers_down"]
    ] == ["flaky"]

    Provider.objects.filter(pk=provider.pk).update(base_url=f"{standin}/v1")
    assert complete(api, agent.name) == 200
    (up,) = Alert.objects.filter(kind="provider-up")
    assert "answers again" in up.message
    provider.refresh_from_db()
    assert provider.failing_since is None and provider.down_alerted_at is None
    assert dashboard_snapshot(runtime.pacer, now_ms=time.time() * 1000)["providers_down"] == []


@override_settings(AGENTOPS_PROVIDER_DOWN_AFTER_MS=1)
@pytest.mark.parametrize("model", ["error:status=429", "error:status=400", "refuse"])
def test_answers_that_say_the_provider_is_up_start_no_episode(
    api: Client, standin: str, model: str, make_agent: Any
) -> None:
    agent = make_agent(model=model)
    for _ in range(2):
        complete(api, agent.name)
        # No episode begins: were one begun, any failure past the 1 ms setting would alert.
        assert Provider.objects.get(pk=agent.provider_id).failing_since is None
    assert not Alert.objects.filter(kind="provider-down").exists()


WINDOW_MS = 2000


@pytest.fixture(scope="module")
def down_workers(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(
        1, label="down", extra_env={"AGENTOPS_PROVIDER_DOWN_AFTER_MS": str(WINDOW_MS)}
    )


@override_settings(AGENTOPS_PROVIDER_DOWN_AFTER_MS=WINDOW_MS)
def test_the_alert_comes_when_the_window_passes_with_no_call_after_the_first(
    api: Client, down_workers: WorkerPool
) -> None:
    down_workers.routed()
    provider = ProviderFactory.create(name="gone", kind="openai", base_url=REFUSED)
    agent = AgentFactory.create(provider=provider, model="answer")
    assert complete(api, agent.name) == 502  # the only call: nothing calls again
    provider.refresh_from_db()
    assert provider.failing_since is not None
    down = wait_for(
        lambda: Alert.objects.filter(kind="provider-down").first(),
        timeout=WINDOW_MS / 1000 + 15,
        what="the provider-down alert",
    )
    late = down.created_at - (provider.failing_since + timedelta(milliseconds=WINDOW_MS))
    assert timedelta(0) <= late < timedelta(seconds=10), late
    assert "could not be reached" in down.message and "HTTP None" not in down.message
    assert REFUSED in down.message and down.data["base_url"] == REFUSED
    # The worker has run every task it was sent (a second check would be one)...
    wait_for(down_workers.idle, what="the worker to run every task it was sent")
    assert Alert.objects.filter(kind="provider-down").count() == 1
    # ...and the check delivered again finds the alert raised and raises none.
    assert provider_down_check(provider_id=provider.pk, window_ms=WINDOW_MS) is False
    assert Alert.objects.filter(kind="provider-down").count() == 1
