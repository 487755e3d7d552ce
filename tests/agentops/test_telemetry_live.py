"""Traces and metrics as a collector receives them (architecture.md §16, docs/observability.md): the
service's own processes (a real uvicorn web process, real Celery workers) export over OTLP/HTTP
to a receiver in this test process (``tests.otlp``), pointed there by the standard
``OTEL_EXPORTER_OTLP_ENDPOINT``; the stand-in provider answers the calls."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentops.celery import task_send
from agentops.models import HistoryRow
from agentops.tokens import api_token_create
from inference.models import InferenceCall, Turn
from tests.agentops.live_asgi import asgi_server
from tests.conftest import LOG_DIR, WorkerPool, wait_for, worker_pool
from tests.factories import HistoryRowFactory
from tests.otlp import Receiver, Span, by_agent

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(150)]

BOUNDS = {
    "progress_bounds": {"before_content_ms": 800, "between_events_ms": 800},
    "flat_minimum_ms": 5000,
    "absolute_ms": 10000,
}
SERVICE = {
    "AGENTOPS_INFERENCE_BOUNDS": json.dumps(BOUNDS),
    "AGENTOPS_DEADLINE_RETRY_DELAY_MS": "200",
    "AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS": "1000",
    "AGENTOPS_WAIT_RECHECK_MS": "1000",
    # The first poisoned failure probes (the other tests' failures are never sheddable).
    "AGENTOPS_BREAKER_THRESHOLD": "1",
}
HOLD_429 = "error:status=429,form=retry-after-ms,wait_ms=600000,times=1"


def otel_env(receiver: Receiver) -> dict[str, str]:
    """The standard environment pointing a process at the receiver, flushing fast."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRIC_EXPORT_INTERVAL": "500",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test",
    }


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


@pytest.fixture(scope="module")
def failures_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("otel") / "failures.log"


@pytest.fixture(scope="module")
def traced_workers(
    receiver: Receiver, failures_path: Path, django_db_setup: None, django_db_blocker: Any
) -> Iterator[WorkerPool]:
    yield from worker_pool(
        1,
        label="otel",
        extra_env={**otel_env(receiver), **SERVICE, "AGENTOPS_FAILURES_LOG": str(failures_path)},
    )


@pytest.fixture(scope="module")
def web(
    receiver: Receiver, traced_workers: WorkerPool, django_db_setup: None, django_db_blocker: Any
) -> Iterator[str]:
    yield from asgi_server(
        "otel", {**otel_env(receiver), **SERVICE, "AGENTOPS_CELERY_QUEUE": traced_workers.queue}
    )


@pytest.fixture
def client(web: str, traced_workers: WorkerPool) -> Iterator[httpx.Client]:
    traced_workers.routed()
    token = api_token_create(name="otel", operator=True)[1]
    with httpx.Client(
        base_url=web, headers={"Authorization": f"Bearer {token}"}, timeout=20
    ) as http:
        yield http


def traceparent() -> tuple[str, str, str]:
    """A client's own ``traceparent`` (sampled), its trace id and its span id."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def submit(http: httpx.Client, agent: str, header: str, text: str = "Hi") -> int:
    answered = http.post(
        f"/api/v1/agents/{agent}/turns",
        json={"messages": [{"participant": "alice", "content": text}]},
        headers={"traceparent": header},
    )
    assert answered.status_code == 202, answered.text
    return int(answered.json()["id"])


def ended(turn_id: int, *statuses: str, timeout: float = 30) -> Turn:
    found: Turn = wait_for(
        lambda: Turn.objects.filter(pk=turn_id, status__in=statuses).first(),
        timeout=timeout,
        what=f"turn {turn_id} to be {statuses}",
    )
    return found


def attempts(receiver: Receiver, trace_id: str, count: int) -> list[Span]:
    found = receiver.wait_spans(
        lambda s: s.trace_id == trace_id and s.name.startswith("chat "),
        count=count,
        what="attempt spans",
    )
    return sorted(found, key=lambda s: s.start_ns)


def turn_span(receiver: Receiver, trace_id: str) -> Span:
    [found] = receiver.wait_spans(
        lambda s: s.trace_id == trace_id and s.name == "agentops.turn", what="the turn span"
    )
    return found


def test_a_streamed_turn_is_one_trace_from_the_clients_request_to_its_attempt_with_usage(
    client: httpx.Client,
    receiver: Receiver,
    traced_workers: WorkerPool,
    make_agent: Any,
) -> None:
    agent = make_agent(model="answer")
    header, trace_id, client_span = traceparent()
    turn = ended(submit(client, agent.name, header), "succeeded")
    call = InferenceCall.objects.get(turn=turn)

    [attempt] = attempts(receiver, trace_id, 1)
    assert attempt.kind == "client" and attempt.name == "chat answer" and attempt.status == "unset"
    a = attempt.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.request.model"] == "answer" and a["gen_ai.response.model"] == "answer"
    assert a["gen_ai.request.max_tokens"] == agent.max_tokens and a["gen_ai.request.stream"] is True
    assert call.input_tokens and call.output_tokens
    assert (
        a["gen_ai.usage.input_tokens"] == call.input_tokens
        and a["gen_ai.usage.output_tokens"] == call.output_tokens
    )
    assert (
        a["gen_ai.response.finish_reasons"] == ["end_turn"] and "error.type" not in a
    )  # as the call row says it
    assert a["agentops.agent"] == agent.name and a["agentops.project"] == "default"
    assert (
        a["agentops.call.id"] == call.pk
        and a["agentops.turn.id"] == turn.pk
        and a["agentops.call.kind"] == "primary"
    )
    assert (
        a["agentops.call.model_events"] == call.model_events > 0
        and a["agentops.call.keepalives"] == call.keepalives
    )
    assert attempt.resource["agentops.worker.name"] == traced_workers.names[0]
    assert (
        attempt.resource["host.name"]
        and attempt.resource["process.pid"] == traced_workers.procs[0].pid
    )
    assert (
        attempt.resource["service.name"] == "agentops"
        and attempt.resource["deployment.environment.name"] == "test"
    )

    # The turn span (ended by the worker, started at submit in the web process) is the
    # attempt's parent, and the submit's server span, continuing the client's context, is its.
    turn_root = turn_span(receiver, trace_id)
    assert attempt.parent_span_id == turn_root.span_id
    assert (
        turn_root.attributes["agentops.turn.id"] == turn.pk
        and turn_root.attributes["agentops.turn.status"] == "succeeded"
    )
    assert turn_root.start_ns < attempt.start_ns <= attempt.end_ns <= turn_root.end_ns
    [server] = receiver.wait_spans(
        lambda s: s.span_id == turn_root.parent_span_id, what="the submit's server span"
    )
    assert server.kind == "server" and server.parent_span_id == client_span
    assert server.resource["agentops.process.role"] == "web"

    duration = receiver.wait_points(
        "gen_ai.client.operation.duration",
        lambda p: p.attributes.get("gen_ai.request.model") == "answer",
    )
    assert (
        duration[0].unit == "s"
        and duration[-1].count >= 1
        and duration[-1].attributes["gen_ai.provider.name"] == "openai"
    )
    usage = receiver.wait_points(
        "gen_ai.client.token.usage", lambda p: p.attributes.get("gen_ai.request.model") == "answer"
    )
    assert {p.attributes["gen_ai.token.type"] for p in usage} == {"input", "output"} and usage[
        0
    ].unit == "{token}"


def test_a_keepalive_only_stream_is_cut_before_content_and_its_fresh_call_is_the_next_span(
    client: httpx.Client,
    receiver: Receiver,
    make_agent: Any,
    failures_path: Path,
) -> None:
    agent = make_agent(model="pings:interval_ms=50")
    header, trace_id, _ = traceparent()
    turn = ended(submit(client, agent.name, header), "failed")

    first, fresh = attempts(receiver, trace_id, 2)
    for cut in (first, fresh):
        assert cut.status == "error" and cut.attributes["error.type"] == "before_content"
        assert (
            cut.attributes["agentops.call.model_events"] == 0
            and cut.attributes["agentops.call.keepalives"] > 3
        )
        assert cut.attributes["agentops.cut.lateness_ms"] >= 0
    assert first.end_ns <= fresh.start_ns  # the fresh call went after the cut one ended
    root = turn_span(receiver, trace_id)
    assert root.status == "error" and root.attributes["error.type"] == "before_content"
    assert {first.parent_span_id, fresh.parent_span_id} == {root.span_id}
    assert receiver.wait_points(
        "agentops.call.cut.lateness",
        lambda p: p.attributes.get("agentops.cut.bound") == "before_content",
    )

    # The incident line in failures.log carries the turn's trace.
    line = wait_for(
        lambda: next((r for r in _records(failures_path) if r.get("turn") == turn.pk), None),
        what="the failures.log line",
    )
    assert line["trace_id"] == trace_id and line["span_id"] == root.span_id
    assert line["host"] and line["pid"] and line["worker"]


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_429_holds_the_turn_and_its_release_resumes_it_in_the_same_trace(
    client: httpx.Client,
    receiver: Receiver,
    make_agent: Any,
) -> None:
    agent = make_agent(model=HOLD_429)
    header, trace_id, _ = traceparent()
    turn_id = submit(client, agent.name, header)
    ended(turn_id, "held")
    [limited] = attempts(receiver, trace_id, 1)
    assert (
        limited.attributes["error.type"] == "rate_limit"
        and limited.attributes["http.response.status_code"] == 429
    )
    assert limited.attributes["agentops.wait.stated_ms"] == 600000

    released = client.post(
        "/api/v1/waits/release",
        json={"agent": agent.name, "model": HOLD_429, "reason": "otel test"},
    )
    assert released.status_code == 200, released.text
    ended(turn_id, "succeeded")

    limited, answered = attempts(receiver, trace_id, 2)
    assert (
        "error.type" not in answered.attributes
        and answered.parent_span_id == limited.parent_span_id
    )
    root = turn_span(receiver, trace_id)
    assert root.span_id == answered.parent_span_id and root.status == "unset"
    names = [e.name for e in sorted(root.events, key=lambda e: e.at_ns)]
    assert names[:2] == ["agentops.turn.held", "agentops.turn.released"], names
    assert "agentops.turn.resumed" in names
    assert root.event("agentops.turn.released").attributes["agentops.release.by"] == "api:otel"
    assert root.event("agentops.turn.resumed").attributes["agentops.held_ms"] > 0
    release = receiver.wait_spans(
        lambda s: s.name == "agentops.wait.release" and by_agent(agent.name)(s),
        what="the release span",
    )[0]
    assert (
        release.attributes["agentops.wait.model"] == HOLD_429
        and release.attributes["agentops.release.lifted"] == 1
    )
    assert receiver.wait_points(
        "agentops.turn.held.duration", lambda p: p.attributes.get("agentops.agent") == agent.name
    )


def test_a_poisoned_turns_probe_shed_and_retry_are_in_its_trace_and_a_restore_is_found_by_agent(
    client: httpx.Client,
    receiver: Receiver,
    make_agent: Any,
) -> None:
    agent = make_agent(model="poison")
    # An older message never answered: once the poisoned row is set aside the retry has it to
    # answer (with only notes left it would end without a call, architecture.md §5.8).
    HistoryRowFactory.create(agent=agent, seq=1, content="message 0")
    header, trace_id, _ = traceparent()
    failed_id = submit(client, agent.name, header, text="POISON")
    ended(failed_id, "failed")
    retry = wait_for(
        lambda: Turn.objects.filter(agent=agent, status="succeeded").exclude(pk=failed_id).first(),
        what="the retry after the shed",
    )
    turns = {
        s.attributes["agentops.turn.id"]: s
        for s in receiver.wait_spans(
            lambda s: s.trace_id == trace_id and s.name == "agentops.turn", count=2
        )
    }
    failed, retried = turns[failed_id], turns[retry.pk]
    assert failed.status == "error" and failed.attributes["error.type"] == "invalid_request"

    def one(name: str) -> Span:
        [found] = receiver.wait_spans(
            lambda s: s.trace_id == trace_id and s.name == name, what=name
        )
        return found

    probe, shed = one("agentops.breaker.probe"), one("agentops.breaker.shed")
    assert (
        probe.parent_span_id == failed.span_id
        and probe.attributes["agentops.breaker.verdict"] == "answered"
    )
    [probe_call] = [
        s for s in attempts(receiver, trace_id, 3) if s.attributes["agentops.call.kind"] == "probe"
    ]
    assert (
        probe_call.parent_span_id == probe.span_id
        and probe_call.attributes["agentops.turn.id"] == failed_id
    )
    poisoned = HistoryRow.objects.get(agent=agent, state="set_aside")
    assert shed.parent_span_id == probe.span_id and shed.attributes[
        "agentops.history.set_aside"
    ] == [poisoned.seq]
    assert retried.parent_span_id == shed.span_id
    assert retried.event("agentops.turn.set_aside").attributes["agentops.history.set_aside"] == [
        poisoned.seq
    ]
    assert {s.attributes["agentops.agent"] for s in (failed, retried, probe, shed, probe_call)} == {
        agent.name
    }

    restored = client.post(
        f"/api/v1/agents/{agent.name}/history/{poisoned.pk}/restore",
        json={"requester": "otel test"},
    )
    assert restored.status_code == 200, restored.text
    [restore] = receiver.wait_spans(
        lambda s: s.name == "agentops.breaker.restore" and by_agent(agent.name)(s),
        what="the restore span",
    )
    assert (
        restore.attributes["agentops.history.row_id"] == poisoned.pk
        and restore.attributes["agentops.restore.by"] == "api:otel"
    )


def test_a_drop_in_call_continues_the_clients_traceparent(
    client: httpx.Client, receiver: Receiver, make_agent: Any
) -> None:
    agent = make_agent(model="answer")
    header, trace_id, client_span = traceparent()
    answered = client.post(
        "/v1/chat/completions",
        headers={"traceparent": header},
        json={
            "model": agent.name,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert answered.status_code == 200 and "[DONE]" in answered.text
    [attempt] = attempts(receiver, trace_id, 1)
    [server] = receiver.wait_spans(
        lambda s: s.span_id == attempt.parent_span_id, what="the drop-in's server span"
    )
    assert (
        server.kind == "server"
        and server.trace_id == trace_id
        and server.parent_span_id == client_span
    )
    assert (
        attempt.attributes["agentops.call.kind"] == "auxiliary"
        and attempt.attributes["gen_ai.request.model"] == "answer"
    )
    assert (
        attempt.attributes["gen_ai.usage.output_tokens"] > 0
        and attempt.attributes["agentops.agent"] == agent.name
    )
    # The server answered many health probes by now (its fixture waits on them): none is traced.
    assert not receiver.spans(lambda s: s.attributes.get("http.route") == "health")


def test_an_auxiliary_completion_is_a_child_of_its_request(
    client: httpx.Client, receiver: Receiver, make_agent: Any
) -> None:
    agent = make_agent(model="answer")
    header, trace_id, _ = traceparent()
    answered = client.post(
        f"/api/v1/agents/{agent.name}/complete",
        headers={"traceparent": header},
        json={"messages": [{"participant": "a", "content": "hi"}]},
    )
    assert answered.status_code == 200, answered.text
    [attempt] = attempts(receiver, trace_id, 1)
    assert (
        attempt.attributes["gen_ai.request.stream"] is False
        and attempt.attributes["agentops.call.id"] == answered.json()["call"]["id"]
    )
    [server] = receiver.wait_spans(
        lambda s: s.span_id == attempt.parent_span_id, what="the request's server span"
    )
    assert server.kind == "server"


# --- a worker killed mid-turn ---------------------------------------------------------------

LEASE = {"AGENTOPS_TURN_LEASE_MS": "3000", "AGENTOPS_TURN_LEASE_GRACE_MS": "300"}


@pytest.fixture
def takeover(
    receiver: Receiver, django_db_setup: None, django_db_blocker: Any
) -> Iterator[tuple[WorkerPool, str]]:
    """A worker whose turns another will take over, and a web process that sends it turns."""
    env = {**otel_env(receiver), **SERVICE, **LEASE}
    with (
        contextmanager(worker_pool)(1, label="otel-lost", extra_env=env) as pool,
        contextmanager(asgi_server)(
            "otel-takeover", {**env, "AGENTOPS_CELERY_QUEUE": pool.queue}
        ) as base,
    ):
        yield pool, base


def test_a_turn_taken_over_after_its_worker_died_stays_in_its_trace_and_says_who_took_it(
    takeover: tuple[WorkerPool, str],
    receiver: Receiver,
    standin_requests: Any,
    make_agent: Any,
) -> None:
    lost, base = takeover
    agent = make_agent(model="sequence:steps=hang|answer")
    token = api_token_create(name="otel-takeover", operator=True)[1]
    header, trace_id, _ = traceparent()
    with httpx.Client(
        base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=20
    ) as http:
        turn_id = submit(http, agent.name, header)
    wait_for(
        lambda: InferenceCall.objects.filter(turn_id=turn_id, outcome__isnull=True).exists(),
        what="the first call to be out",
    )
    # Its row is written just before it is sent: killed in between, the sequence's hang would be
    # the next worker's call (a third attempt span; seen under load).
    wait_for(lambda: len(standin_requests()) >= 1, what="the stand-in to receive the first call")
    lost.procs[0].send_signal(signal.SIGKILL)
    lost.procs[0].wait(timeout=10)

    with contextmanager(worker_pool)(
        1, label="otel-took", extra_env={**otel_env(receiver), **SERVICE, **LEASE}, queue=lost.queue
    ) as took:

        def resumed() -> bool:
            task_send(
                "inference.tasks.agent_drain", agent.pk
            )  # as the beat's sweep does, once the lease lapsed
            return Turn.objects.filter(pk=turn_id, status="succeeded").exists()

        wait_for(resumed, timeout=40, interval=1.0, what="the turn to be taken over and succeed")
        root = turn_span(receiver, trace_id)
        event = root.event("agentops.turn.taken_over")
        assert lost.names[0] in event.attributes["agentops.lease.lost_by"]
        assert took.names[0] in event.attributes["agentops.lease.taken_by"]
        assert root.resource["agentops.worker.name"] == took.names[0]

        aborted, answered = attempts(receiver, trace_id, 2)
        assert (
            aborted.attributes["error.type"] == "aborted"
            and aborted.resource["agentops.worker.name"] == took.names[0]
        )
        assert "error.type" not in answered.attributes and {
            aborted.parent_span_id,
            answered.parent_span_id,
        } == {root.span_id}

        log = (LOG_DIR / f"{took.names[0].split('@')[0]}.log").read_text()
        [line] = [
            line for line in log.splitlines() if "taken over" in line and f"turn {turn_id}" in line
        ]
        assert " WARNING " in line and lost.names[0] in line and took.names[0] in line
        assert re.search(rf"trace_id={trace_id}\b", line)
        assert f"{took.names[0]} pid {took.procs[0].pid}" in line
    assert (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") is None
    )  # the test process itself exports nothing
