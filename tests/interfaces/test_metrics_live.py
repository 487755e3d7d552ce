"""``/metrics`` moving as real turns run: a real worker, the stand-in over sockets, and the
project's own URL for the scrape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from inference.models import InferenceCall
from tests.breaker.test_live import alerts, fail_in_a_row
from tests.calls.test_bounds_live import POOL_ENV
from tests.conftest import WorkerPool, scraper, wait_for, worker_pool
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True)]

Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture(scope="module")
def bounded_pool(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    """One worker whose bounds are half a second (tests.calls.test_bounds_live)."""
    yield from worker_pool(1, label="metrics-bounded", extra_env=POOL_ENV)


@pytest.fixture
def bounded(bounded_pool: WorkerPool) -> WorkerPool:
    return bounded_pool.routed()


def scrape() -> Scrape:
    response = scraper().get("/metrics")
    assert response.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def value(samples: Scrape, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


CUT_BEFORE_CONTENT = {"kind": "primary", "outcome": "cut", "bound": "before_content"}


def test_a_turn_cut_before_content_moves_the_cut_counter_of_that_bound_and_the_lateness_histogram(
    bounded: WorkerPool, api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="pings:interval_ms=50")
    before = scrape()
    turn = wait_turn(api, submit(api, agent.name, ("alice", "hello"))["id"])
    assert turn["status"] == "failed", turn
    cut = InferenceCall.objects.filter(agent=agent, outcome="cut", bound="before_content").count()
    assert cut == 2  # the call and its one fresh call
    after = scrape()

    assert (
        value(after, "agentops_calls_total", **CUT_BEFORE_CONTENT)
        == value(before, "agentops_calls_total", **CUT_BEFORE_CONTENT) + cut
    )
    assert (
        value(after, "agentops_cut_lateness_ms_count")
        == value(before, "agentops_cut_lateness_ms_count") + cut
    )
    assert (
        value(after, "agentops_cut_lateness_ms_bucket", le="+Inf")
        == value(before, "agentops_cut_lateness_ms_bucket", le="+Inf") + cut
    )
    assert value(after, "agentops_cut_lateness_ms_sum") > value(
        before, "agentops_cut_lateness_ms_sum"
    )
    for bound in ("between_events", "flat", "absolute", "whole_call"):
        labels = {**CUT_BEFORE_CONTENT, "bound": bound}
        assert value(after, "agentops_calls_total", **labels) == value(
            before, "agentops_calls_total", **labels
        )


@pytest.mark.usefixtures("workers")
def test_a_probe_refused_like_the_failure_moves_the_refused_probes_counter(
    api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="refuse")
    before = scrape()
    # Failures 1 and 2 count; failure 3 reaches the threshold and probes, which is refused too.
    fail_in_a_row(api, agent, 3, settled=lambda i: alerts(agent, "history-kept") == max(i - 1, 0))
    wait_for(
        lambda: (
            value(scrape(), "agentops_probes_total", verdict="refused")
            == value(before, "agentops_probes_total", verdict="refused") + 1
        ),
        what="the refused probe to be counted",
    )
    after = scrape()
    for verdict in ("answered", "unclear", "set_aside", "pending"):
        assert value(after, "agentops_probes_total", verdict=verdict) == value(
            before, "agentops_probes_total", verdict=verdict
        )
    assert InferenceCall.objects.get(agent=agent, kind="probe").probe_verdict == "refused"
