"""What a project limit costs a call (architecture.md §6.14): ``ProjectLimiter.take`` and what
follows a call's end (its slot released, its tokens corrected), against the embedded Redis,
for a project with all three limits and for one with none (the check a call without limits
pays: a dictionary lookup). Not part of the suite (the file name does not match
``test_*.py``); run it on purpose:

    python -m devtools.launcher exec -- python -m pytest bench/project_limits_bench.py -q -s
"""

from __future__ import annotations

import statistics
import time

import pytest

from agentops.models import Project
from calls.project_limits import ProjectLimiter, Taken

pytestmark = pytest.mark.django_db

CALLS = 5_000


def _quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e6, ordered[int(len(ordered) * 0.99)] * 1e6


def test_the_cost_of_a_project_limit_per_call() -> None:
    limited = Project.objects.create(
        name="bench-limited",
        requests_per_minute=100_000,
        tokens_per_minute=1_000_000_000,
        concurrent_calls=10_000,
    )
    free = Project.objects.create(name="bench-free")
    limiter = ProjectLimiter()

    for _ in range(200):  # warm: connections, scripts loaded
        taken = limiter.take(project_id=limited.pk, tokens=1200, now_ms=time.time() * 1000)
        assert isinstance(taken, Taken)
        limiter.release(taken)
        limiter.tokens_used(taken, 100)

    takes, ends = [], []
    for _ in range(CALLS):
        started = time.perf_counter()
        taken = limiter.take(project_id=limited.pk, tokens=1200, now_ms=time.time() * 1000)
        middle = time.perf_counter()
        assert isinstance(taken, Taken)
        limiter.release(taken)
        limiter.tokens_used(taken, 100)
        takes.append(middle - started)
        ends.append(time.perf_counter() - middle)

    unlimited = []
    limiter.take(project_id=free.pk, tokens=0, now_ms=time.time() * 1000)  # read once
    for _ in range(CALLS):
        started = time.perf_counter()
        assert limiter.unlimited(free.pk)
        unlimited.append(time.perf_counter() - started)

    take_p50, take_p99 = _quantiles(takes)
    end_p50, end_p99 = _quantiles(ends)
    free_p50, free_p99 = _quantiles(unlimited)
    print(
        f"\nproject limits, {CALLS} calls: take p50 {take_p50:.0f} µs p99 {take_p99:.0f} µs; "
        f"release + tokens corrected p50 {end_p50:.0f} µs p99 {end_p99:.0f} µs; "
        f"a project without limits p50 {free_p50:.2f} µs p99 {free_p99:.2f} µs"
    )
