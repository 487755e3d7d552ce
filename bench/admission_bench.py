"""Admission cost with 10,000 agents and 1,000 binding waits: each check reads the journal's
newest id (a wait another process committed binds the next call) and the rest from the
process's cached view. Not part of the suite (the file name does not match ``test_*.py``); run
it on purpose:

    python -m devtools.launcher exec -- python -m pytest bench/admission_bench.py -q -s
"""

from __future__ import annotations

import random
import statistics
import time

import pytest
from django.db import connection

from agentops.models import Agent, Provider, default_project_id
from waits.admission import admission_check
from waits.clock import clock_ms
from waits.journal import journal_forget_process_state
from waits.services import wait_record

pytestmark = pytest.mark.django_db


def test_admission_cost_with_10000_agents_and_1000_binding_waits() -> None:
    provider = Provider.objects.create(
        name="bench", kind="openai", base_url="http://127.0.0.1:9/v1"
    )
    project_id = default_project_id()  # bulk_create skips the save() that sets it
    Agent.objects.bulk_create(
        [
            Agent(
                name=f"agent-{i}",
                project_id=project_id,
                provider=provider,
                model="m1",
                participant=f"agent-{i}",
            )
            for i in range(10_000)
        ],
        batch_size=2000,
    )
    agents = list(Agent.objects.all())
    now = clock_ms()
    started = time.perf_counter()
    for agent in agents[:1000]:
        wait_record(agent=agent, model="m1", retry_after_ms=3_600_000, reason="429", now_ms=now)
    recording = (time.perf_counter() - started) / 1000

    journal_forget_process_state()
    started = time.perf_counter()
    assert admission_check(agent=agents[0], model="m1", now_ms=clock_ms()) is not None
    load = time.perf_counter() - started

    rng = random.Random(7)
    samples = []
    calls = 20_000
    held = 0
    queries: list[str] = []

    def counted(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        queries.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted):
        run_started = time.perf_counter()
        for _ in range(calls):
            agent = agents[rng.randrange(len(agents))]
            t0 = time.perf_counter_ns()
            hold = admission_check(agent=agent, model="m1", now_ms=clock_ms())
            samples.append(time.perf_counter_ns() - t0)
            held += hold is not None
        elapsed = time.perf_counter() - run_started
    samples.sort()
    median = statistics.median(samples) / 1000
    p99 = samples[int(len(samples) * 0.99)] / 1000
    p999 = samples[int(len(samples) * 0.999)] / 1000
    worst = samples[-1] / 1000
    print(
        f"\nrecord: {recording * 1000:.2f} ms/act; full load of 1,000 rows: {load * 1000:.1f} ms\n"
        f"{calls} admission checks over {elapsed:.2f} s ({held} held): median {median:.2f} µs, p99 {p99:.2f} µs, "
        f"p99.9 {p999:.1f} µs, max {worst:.0f} µs; {len(queries)} queries in all ({len(queries) / calls:.3f} per call)"
    )
    assert p99 < 1000
