"""``GET /metrics``: Prometheus text that parses, read from the rows at scrape time.

The view is mounted at ``/metrics`` by this module's own urlconf, so these tests do not depend
on how the project's urls are wired."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import path
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from agentops.alerts import alert_raise
from agentops.models import Agent, HistoryRow
from breaker.probe_call import probe_send
from breaker.probes import breaker_probe_begin
from calls.compile import compile_request
from inference.models import InferenceCall, Turn
from interfaces.metrics import metrics_view
from tests.conftest import scraper
from tests.factories import AgentFactory, CallFactory, HistoryRowFactory, TurnFactory
from turns.runtime import TurnRuntime
from waits.clock import clock_ms
from waits.models import WaitJournalEntry
from waits.services import wait_record

urlpatterns = [path("metrics", metrics_view)]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]

Labels = dict[str, str]
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def agent() -> Agent:
    made: Agent = AgentFactory.create(name="ada", model="m1")
    return made


def scrape(client: Client | None = None) -> tuple[Scrape, dict[str, str]]:
    """GET /metrics as Prometheus scrapes it; (every sample by (name, labels), each family's
    type)."""
    response = (client or scraper()).get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    samples: Scrape = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(response.content.decode()):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def value(samples: Scrape, name: str, **labels: str) -> float:
    """A sample's value; 0 when the series is absent (a counter nobody has moved yet)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def call(agent: Agent, **fields: Any) -> InferenceCall:
    made: InferenceCall = CallFactory.create(
        agent=agent, model=agent.model, streamed=True, **fields
    )
    return made


CUT_42 = {"kind": "primary", "outcome": "cut", "bound": "before_content"}


def test_metrics_parse_need_no_token_and_name_every_family(db: None) -> None:
    samples, types = scrape()
    assert types == {
        "agentops_calls": "counter",
        "agentops_tokens": "counter",
        "agentops_spend": "counter",
        "agentops_auxiliary_deferred": "counter",
        "agentops_probes": "counter",
        "agentops_cut_lateness_ms": "histogram",
        "agentops_holds_binding": "gauge",
        "agentops_journal_readable": "gauge",
        "agentops_turns": "gauge",
        "agentops_alerts": "counter",
        "agentops_webhook_deliveries": "counter",
        "agentops_webhook_deliveries_pending": "gauge",
        "agentops_provider_remaining": "gauge",
        "agentops_calls_paced": "counter",
        "agentops_target_calls": "counter",
    }
    assert value(samples, "agentops_journal_readable") == 1
    assert value(samples, "agentops_holds_binding") == 0
    assert value(samples, "agentops_cut_lateness_ms_count") == 0
    assert value(samples, "agentops_cut_lateness_ms_bucket", le="+Inf") == 0
    assert ("agentops_auxiliary_deferred_total", ()) in samples
    assert {labels for name, labels in samples if name == "agentops_turns"} == {
        (("status", s),) for s in Turn.Status.values
    }


def test_a_cut_call_moves_calls_total_and_the_cut_lateness_histogram(agent: Agent) -> None:
    before, _ = scrape()
    call(agent, kind="primary", outcome="cut", bound="before_content", cut_lateness_ms=42)
    after, _ = scrape()

    assert (
        value(after, "agentops_calls_total", **CUT_42)
        == value(before, "agentops_calls_total", **CUT_42) + 1
    )
    assert (
        value(after, "agentops_cut_lateness_ms_count")
        == value(before, "agentops_cut_lateness_ms_count") + 1
    )
    assert (
        value(after, "agentops_cut_lateness_ms_sum")
        == value(before, "agentops_cut_lateness_ms_sum") + 42
    )
    moved = {
        le: value(after, "agentops_cut_lateness_ms_bucket", le=le)
        - value(before, "agentops_cut_lateness_ms_bucket", le=le)
        for le in [
            "1.0",
            "5.0",
            "10.0",
            "25.0",
            "50.0",
            "100.0",
            "250.0",
            "500.0",
            "1000.0",
            "2500.0",
            "5000.0",
            "+Inf",
        ]
    }
    assert moved == {
        "1.0": 0,
        "5.0": 0,
        "10.0": 0,
        "25.0": 0,
        "50.0": 1,
        "100.0": 1,
        "250.0": 1,
        "500.0": 1,
        "1000.0": 1,
        "2500.0": 1,
        "5000.0": 1,
        "+Inf": 1,
    }


def test_the_histogram_counts_only_cut_calls_and_a_value_on_a_bucket_edge_falls_in_that_bucket(
    agent: Agent,
) -> None:
    call(agent, outcome="cut", bound="between_events", cut_lateness_ms=25)
    call(agent, outcome="cut", bound="flat", cut_lateness_ms=9000)
    call(agent, outcome="completed", cut_lateness_ms=3)  # not cut: not in the histogram
    call(agent, outcome="cut", bound="absolute")  # cut, lateness unknown: not in the histogram
    samples, _ = scrape()
    assert value(samples, "agentops_cut_lateness_ms_count") == 2
    assert value(samples, "agentops_cut_lateness_ms_sum") == 9025
    assert value(samples, "agentops_cut_lateness_ms_bucket", le="10.0") == 0
    assert value(samples, "agentops_cut_lateness_ms_bucket", le="25.0") == 1
    assert value(samples, "agentops_cut_lateness_ms_bucket", le="5000.0") == 1
    assert value(samples, "agentops_cut_lateness_ms_bucket", le="+Inf") == 2


def test_calls_are_counted_per_kind_outcome_and_bound_with_in_flight_and_none_for_nulls(
    agent: Agent,
) -> None:
    call(agent)  # in flight
    call(agent)
    call(agent, outcome="completed")
    call(agent, kind="probe", outcome="error")
    samples, _ = scrape()
    assert (
        value(samples, "agentops_calls_total", kind="primary", outcome="in_flight", bound="none")
        == 2
    )
    assert (
        value(samples, "agentops_calls_total", kind="primary", outcome="completed", bound="none")
        == 1
    )
    assert value(samples, "agentops_calls_total", kind="probe", outcome="error", bound="none") == 1
    assert sum(v for (name, _), v in samples.items() if name == "agentops_calls_total") == 4


def test_a_deferred_auxiliary_call_moves_the_auxiliary_deferred_counter(agent: Agent) -> None:
    call(agent, kind="primary", outcome="deferred")  # a deferred primary call is not auxiliary
    call(agent, kind="auxiliary", outcome="completed")
    before, _ = scrape()
    call(agent, kind="auxiliary", outcome="deferred")
    after, _ = scrape()
    assert value(before, "agentops_auxiliary_deferred_total") == 0
    assert value(after, "agentops_auxiliary_deferred_total") == 1


def test_probes_are_counted_by_verdict_with_pending_for_a_probe_not_yet_read(agent: Agent) -> None:
    call(agent, kind="probe", outcome="completed", probe_verdict="answered")
    call(agent, kind="probe", outcome="error", probe_verdict="refused")
    call(agent, kind="probe", outcome="error", probe_verdict="refused")
    call(agent, kind="probe")  # out: no verdict yet
    call(agent, kind="primary", outcome="completed")  # not a probe
    samples, _ = scrape()
    assert value(samples, "agentops_probes_total", verdict="answered") == 1
    assert value(samples, "agentops_probes_total", verdict="refused") == 2
    assert value(samples, "agentops_probes_total", verdict="pending") == 1
    assert sum(v for (name, _), v in samples.items() if name == "agentops_probes_total") == 4


@pytest.mark.django_db(transaction=True)  # the probe reads in the runtime's database threads
def test_a_probe_deferred_by_a_provider_wait_gets_its_row_and_is_counted(
    runtime: TurnRuntime, agent: Agent
) -> None:
    HistoryRowFactory.create(agent=agent, seq=1, participant="alice", content="hello")
    failed = compile_request(agent, HistoryRow.objects.filter(agent=agent).order_by("seq"))
    wait_record(
        agent=agent, model="m1", retry_after_ms=600_000, reason="429 slow down", now_ms=clock_ms()
    )
    turn = TurnFactory.create(agent=agent, status=Turn.Status.RUNNING)
    ticket = breaker_probe_begin(agent=agent)
    outcome = asyncio.run(probe_send(runtime, turn=turn, failed=failed, ticket=ticket))
    assert outcome.outcome == "deferred" and outcome.call_id is not None
    row = InferenceCall.objects.get(pk=outcome.call_id)
    assert (row.kind, row.outcome, row.turn_id, row.model) == ("probe", "deferred", turn.pk, "m1")
    samples, _ = scrape()
    assert (
        value(samples, "agentops_probes_total", verdict="pending") == 1
    )  # until the breaker reads it


def test_the_turns_gauge_counts_turns_by_status(agent: Agent) -> None:
    TurnFactory.create(agent=agent, status=Turn.Status.RUNNING)
    TurnFactory.create(agent=agent, status=Turn.Status.HELD)
    TurnFactory.create(agent=agent, status=Turn.Status.HELD)
    samples, _ = scrape()
    assert value(samples, "agentops_turns", status="running") == 1
    assert value(samples, "agentops_turns", status="held") == 2
    assert value(samples, "agentops_turns", status="queued") == 0


def test_raising_an_alert_moves_alerts_total_of_its_kind(db: None) -> None:
    alert_raise(kind="hard-down", agent="ada", model="m1", message="the model is down")
    before, _ = scrape()
    alert_raise(
        kind="turn-exhausted", agent="ada", model="m1", message="a turn ran out of attempts"
    )
    alert_raise(
        kind="turn-exhausted", agent="bob", model="m1", message="a turn ran out of attempts"
    )
    after, _ = scrape()
    assert value(before, "agentops_alerts_total", kind="hard-down") == 1
    assert value(before, "agentops_alerts_total", kind="turn-exhausted") == 0
    assert value(after, "agentops_alerts_total", kind="turn-exhausted") == 2
    assert value(after, "agentops_alerts_total", kind="hard-down") == 1


def test_a_recorded_provider_wait_shows_as_a_binding_hold(agent: Agent) -> None:
    wait_record(
        agent=agent, model="m1", retry_after_ms=600_000, reason="429 slow down", now_ms=clock_ms()
    )
    samples, _ = scrape()
    assert value(samples, "agentops_holds_binding") == 1
    assert value(samples, "agentops_journal_readable") == 1


def test_an_unreadable_journal_reads_0_and_holds_every_agent(agent: Agent) -> None:
    AgentFactory.create(name="bob")
    AgentFactory.create(name="eph", kind=Agent.Kind.EPHEMERAL)  # never held by unreadable records
    WaitJournalEntry.objects.create(
        act_id=uuid.uuid4(), kind="pause", agent="ada", model="m1", at=timezone.now()
    )
    samples, _ = scrape()
    assert value(samples, "agentops_journal_readable") == 0
    assert value(samples, "agentops_holds_binding") == 2


def test_a_scrape_costs_the_same_few_queries_however_many_rows_there_are(agent: Agent) -> None:
    prometheus = scraper()
    scrape(prometheus)  # the journal's first load is its own; later scrapes only poll it

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            scrape(prometheus)
        return len(captured.captured_queries)

    empty = queries()
    for i in range(30):
        turn = TurnFactory.create(agent=agent, status=Turn.Status.SUCCEEDED)
        call(agent, turn=turn, outcome="cut", bound="flat", cut_lateness_ms=i)
        call(agent, turn=turn, kind="auxiliary", outcome="deferred")
        alert_raise(kind=f"kind-{i % 3}", agent="ada", message="x")
    # The token's check, and 11 for the counts (one: the budget holds, read beside the journal;
    # one: calls by the target that served them).
    assert queries() == empty <= 12


def test_metrics_answer_only_get_and_head(db: None) -> None:
    assert scraper().head("/metrics").status_code == 200
    assert scraper().post("/metrics").status_code == 405


def test_metrics_need_an_operator_token_unless_public(
    db: None, user_token: str, settings: Any
) -> None:
    """Its labels name every project's agents and models."""
    refused = Client().get("/metrics")
    assert refused.status_code == 401 and refused["WWW-Authenticate"] == "Bearer"
    assert (
        Client(headers={"Authorization": f"Bearer {user_token}"}).get("/metrics").status_code == 403
    )
    assert (
        Client(headers={"Authorization": "Bearer not-a-token"}).get("/metrics").status_code == 401
    )
    settings.AGENTOPS_METRICS_PUBLIC = True
    assert Client().get("/metrics").status_code == 200
