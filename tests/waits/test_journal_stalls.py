"""A database that does not answer, seen from a worker process (architecture.md §6.5): admission
checks fail closed promptly, or answer from the view already read, instead of queueing behind a read
that waits for a connection.

The pytest process runs without a connection pool (``agentops.settings_test``), so these run a
separate process on ``agentops.settings``, with the pool, as a worker does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from django.conf import settings

from agentops.models import Agent
from tests.conftest import _database_url
from waits.journal import JOURNAL_POLL_MS
from waits.services import wait_record

from .conftest import BASE_DIR, NOW

# Generous: the fix answers within about a second; without it a check waits for the pool's
# timeout (set far above this bound in each test).
PROMPT_S = 5.0

# A worker's view of the journal, checked on two threads while a third holds the pool's only
# connection: ``first`` waits for a connection (holding the journal's process lock), ``second``
# is a check made meanwhile. Once ``second`` answers, the connection is given back.
STALLED_READ = """
import json, sys, threading, time
from django.db import connection
from agentops.models import Agent
from waits.admission import admission_check

now, warm = float(sys.argv[1]), sys.argv[2] == "warm"
ada = Agent(name="ada", kind=Agent.Kind.RESIDENT)

def check(at):
    started = time.monotonic()
    hold = admission_check(agent=ada, model="m1", now_ms=at)
    return {
        "source": hold.source if hold else None,
        "model": hold.model if hold else None,
        "s": time.monotonic() - started,
    }

at = now
if warm:
    check(now)  # the view is read while the pool has a connection to give
    connection.close()  # back to the pool
    at = now + float(sys.argv[3])  # the next check polls

holding, give_back = threading.Event(), threading.Event()
def hog():
    connection.ensure_connection()
    holding.set()
    give_back.wait()
    connection.close()
threading.Thread(target=hog).start()
holding.wait()

results = {}
def first():
    results["first"] = check(at)
    connection.close()
reader = threading.Thread(target=first)
reader.start()
deadline = time.monotonic() + 10
while connection.pool.get_stats().get("requests_waiting", 0) < 1:  # first waits for a connection
    assert time.monotonic() < deadline, "the first check never asked the pool for a connection"
    time.sleep(0.01)  # a poll, with the deadline above: the pool signals no waiting request
results["second"] = check(at)
give_back.set()
reader.join()
results["after"] = check(at)
print(json.dumps(results))
"""


def run_worker_process(
    code: str, *args: str, env: dict[str, str], timeout: float = 40
) -> dict[str, Any]:
    full_env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "DJANGO_SETTINGS_MODULE": "agentops.settings",
        "AGENTOPS_FAILURES_LOG": str(settings.AGENTOPS_FAILURES_LOG),
        **env,
    }
    # Built as an entry point builds it (``runtime`` in the script), never on first use.
    script = (
        "import django\ndjango.setup()\n"
        "from agentops.runtime import install\nfrom turns.runtime import TurnRuntime\n"
        "runtime = TurnRuntime(worker=False)\nruntime.start()\ninstall(runtime)\n"
    ) + code
    try:
        out = subprocess.run(
            [sys.executable, "-c", script, *args],
            cwd=BASE_DIR,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the worker process did not answer within {timeout} s: {exc.stderr!r}")
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_an_admission_check_fails_closed_within_the_pool_timeout_when_the_database_is_unreachable() -> (
    None
):
    unreachable = _database_url().rsplit("@", 1)[0] + "@127.0.0.1:1/nowhere"
    seen = run_worker_process(
        "import json, time\n"
        "from agentops.models import Agent\n"
        "from waits.admission import admission_check\n"
        "started = time.monotonic()\n"
        "hold = admission_check(\n"
        "    agent=Agent(name='ada', kind=Agent.Kind.RESIDENT), model='m1', now_ms=1.8e12\n"
        ")\n"
        "print(json.dumps({'source': hold and hold.source, 'model': hold and hold.model,\n"
        "                  's': time.monotonic() - started}))\n",
        env={"DATABASE_URL": unreachable, "AGENTOPS_DB_POOL_TIMEOUT_MS": "1000"},
    )
    assert (seen["source"], seen["model"]) == ("unreadable", "*")
    assert seen["s"] < PROMPT_S


@pytest.mark.django_db(transaction=True)
def test_a_check_behind_a_first_read_that_gets_no_connection_fails_closed_within_the_pool_timeout() -> (
    None
):
    # A first read that is merely slow is waited for (up to the pool's timeout and a margin),
    # so a worker starting many turns at once does not take it for an unreadable journal; one
    # that gets no connection at all fails closed, and so does the check behind it.
    seen = run_worker_process(
        STALLED_READ,
        str(NOW),
        "cold",
        env={"AGENTOPS_DB_POOL_SIZE": "1", "AGENTOPS_DB_POOL_TIMEOUT_MS": "1000"},
    )
    assert (seen["first"]["source"], seen["first"]["model"]) == ("unreadable", "*")
    assert (seen["second"]["source"], seen["second"]["model"]) == ("unreadable", "*")
    # at most the first read's two waits for a connection (its read, its alert) and its own
    assert seen["second"]["s"] < 1.0 * 3 + PROMPT_S


@pytest.mark.django_db(transaction=True)
def test_a_check_behind_a_slow_first_read_waits_for_it_instead_of_failing_closed() -> None:
    stalled, slow = (
        'results["second"] = check(at)\ngive_back.set()',
        'threading.Timer(1.5, give_back.set).start()\nresults["second"] = check(at)',
    )
    assert stalled in STALLED_READ
    seen = run_worker_process(
        STALLED_READ.replace(stalled, slow),
        str(NOW),
        "cold",
        env={"AGENTOPS_DB_POOL_SIZE": "1", "AGENTOPS_DB_POOL_TIMEOUT_MS": "30000"},
    )
    # the connection came back after 1.5 s: both checks read the records, neither failed closed
    assert (
        seen["first"]["source"] is None
        and seen["second"]["source"] is None
        and seen["after"]["source"] is None
    )
    assert seen["second"]["s"] >= 1.0


@pytest.mark.django_db(transaction=True)
def test_a_check_during_a_poll_that_waits_for_a_connection_answers_from_the_view_already_read(
    agent: Agent,
) -> None:
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    seen = run_worker_process(
        STALLED_READ,
        str(NOW),
        "warm",
        str(JOURNAL_POLL_MS),
        env={"AGENTOPS_DB_POOL_SIZE": "1", "AGENTOPS_DB_POOL_TIMEOUT_MS": "30000"},
    )
    assert seen["second"]["source"] == "recorded"  # the wait read before still holds
    assert seen["second"]["s"] < PROMPT_S
    assert seen["first"]["source"] == "recorded" and seen["after"]["source"] == "recorded"
