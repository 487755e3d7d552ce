"""Shared test harness: the stand-in provider and real Celery workers, as real processes.

Tests that involve a worker use ``django_db(transaction=True)`` so the worker (another process,
another connection) sees their rows.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis
from django.conf import settings
from django.test import Client, override_settings

from agentops.celery import app as celery_app
from agentops.models import Agent, Provider
from agentops.runtime import serving
from agentops.tokens import api_token_create
from tests.factories import AgentFactory, ProviderFactory
from turns.runtime import TurnRuntime
from waits.journal import journal_forget_process_state

BASE_DIR = Path(__file__).resolve().parent.parent
LOG_DIR = BASE_DIR / "var" / "test-logs"
QUEUE = f"agentops-test-{socket.gethostname()}-{os.getpid()}"


@pytest.fixture(autouse=True)
def fresh_process_view(tmp_path: Path) -> Iterator[None]:
    """Each test starts as a freshly started process: no cached provider-waits journal, no
    pending acts; the failures.log lines the test process writes go to a scratch file.
    (``override_settings``, not pytest-django's ``settings``: some modules have a fixture of
    that name for their own settings.)"""
    journal_forget_process_state()
    with override_settings(AGENTOPS_FAILURES_LOG=str(tmp_path / "failures.log")):
        yield
    journal_forget_process_state()


def poll_until(predicate: Callable[[], Any], *, timeout: float, interval: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy, and return that; once ``timeout``
    has passed, return its last (falsy) value instead. For waits whose end is not a failure."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > end:
            return value
        # A poll: what the tests wait on (rows, another process's state) sends no event.
        time.sleep(interval)


def wait_for(
    predicate: Callable[[], Any],
    *,
    timeout: float = 20.0,
    interval: float = 0.05,
    what: str = "condition",
) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout``."""
    value = poll_until(predicate, timeout=timeout, interval=interval)
    if not value:
        pytest.fail(f"timed out after {timeout} s waiting for {what}")
    return value


async def refused_with(communicator: Any) -> int | None:
    """The close code a client reads when a consumer refuses its websocket: the socket opens,
    then closes at once with the code (a refusal before the handshake reaches a real client as
    an HTTP 403, its code lost). None when it was refused before the handshake after all."""
    connected, _ = await communicator.connect(timeout=10)
    if not connected:
        return None
    closed = await communicator.receive_output(timeout=10)
    # The consumer lives until the client's side ends too: end it here, not at the loop's close.
    await communicator.disconnect()
    assert closed["type"] == "websocket.close", f"the socket stayed open and sent {closed}"
    return int(closed.get("code", 1000))


def gap_s(call_after: Any, call_before: Any) -> float:
    """Seconds from one call's end to the next call's send."""
    assert call_after.sent_at is not None and call_before.ended_at is not None
    return float((call_after.sent_at - call_before.ended_at).total_seconds())


def _database_url() -> str:
    db = settings.DATABASES["default"]
    auth = quote(db.get("USER") or "")
    if db.get("PASSWORD"):
        auth += ":" + quote(db["PASSWORD"])
    host = db.get("HOST") or ""
    port = f":{db['PORT']}" if db.get("PORT") else ""
    netloc = f"{auth}@{host}{port}" if auth else f"{host}{port}"
    return f"postgres://{netloc}/{db['NAME']}"


def server_process(
    module: str, name: str, *args: str, env: dict[str, str] | None = None
) -> Iterator[str]:
    """The body of a fixture for a test server of ours in its own process (``python -m
    module``, which prints ``<name> listening on URL``): yields its base URL, then stops it."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=BASE_DIR,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=open(LOG_DIR / f"{name}.log", "w"),
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith(f"{name} listening on "), f"{module} did not start: {line!r}"
    yield line.removeprefix(f"{name} listening on ")
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture(scope="session")
def standin() -> Iterator[str]:
    """The stand-in provider as a real HTTP server in its own process. Yields its base URL."""
    yield from server_process("devtools.standin", "standin", "--host", "127.0.0.1", "--port", "0")


@pytest.fixture(scope="session")
def hostile() -> Iterator[str]:
    """The misbehaving provider (``tests.hostile``) as a real server in its own process. Yields
    its base URL."""
    yield from server_process("tests.hostile", "hostile", "--port", "0")


@pytest.fixture
def hostile_requests(hostile: str) -> Callable[[], list[dict[str, Any]]]:
    """Clears the hostile provider's record; returns a reader of the requests since then."""
    httpx.delete(f"{hostile}/_hostile/requests")
    return lambda: httpx.get(f"{hostile}/_hostile/requests").json()


@pytest.fixture
def standin_requests(standin: str) -> Callable[[], list[dict[str, Any]]]:
    """Clears the stand-in's record and counters; returns a reader of requests since then.
    Request it before ``make_agent``/``providers`` so they do not clear it again."""
    httpx.delete(f"{standin}/_standin/requests")
    return lambda: httpx.get(f"{standin}/_standin/requests").json()


class WorkerPool:
    """Real Celery worker processes on the test database, consuming their own queue.

    While a pool is active, the test process enqueues to its queue, so the settings given in
    ``extra_env`` (bounds, delays) are the ones the turns run under."""

    def __init__(
        self,
        count: int,
        *,
        label: str,
        extra_env: dict[str, str] | None = None,
        queue: str | None = None,
    ) -> None:
        # ``queue``: another pool's, for workers that take over from that pool's.
        self.queue = queue or f"{QUEUE}-{label}"
        env = dict(
            os.environ,
            DATABASE_URL=_database_url(),
            AGENTOPS_CELERY_QUEUE=self.queue,
            DJANGO_SETTINGS_MODULE="agentops.settings",
            # Between tests the database is truncated. Should a worker still be finishing a turn
            # then, the worker (not the test's flush) must be the deadlock victim: it notices
            # a deadlock first with a shorter timeout (libpq reads PGOPTIONS).
            PGOPTIONS="-c deadlock_timeout=100ms",
            **(extra_env or {}),
        )
        self.procs: list[subprocess.Popen[bytes]] = []
        self.names = [f"{label}{i}-{os.getpid()}@agentops-test" for i in range(count)]
        self.previous_queue = celery_app.conf.task_default_queue
        celery_app.conf.task_default_queue = self.queue
        for name in self.names:
            log = open(LOG_DIR / f"{name.split('@')[0]}.log", "w")
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "celery",
                        "-A",
                        "agentops",
                        "worker",
                        "-l",
                        "info",
                        "-c",
                        "4",
                        "-P",
                        "threads",
                        "-n",
                        name,
                        "-Q",
                        self.queue,
                        "--without-gossip",
                        "--without-mingle",
                    ],
                    cwd=BASE_DIR,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        client = redis.Redis.from_url(settings.REDIS_URL)
        for name, proc in zip(self.names, self.procs, strict=True):

            def started(name: str = name, proc: subprocess.Popen[bytes] = proc) -> bool:
                return bool(client.exists(f"agentops:worker:{name}")) or proc.poll() is not None

            wait_for(started, timeout=60, what=f"worker {name} to start")
            assert proc.poll() is None, f"worker {name} exited; see {LOG_DIR}"
        client.close()

    def routed(self) -> WorkerPool:
        """Send the tasks enqueued from now on to this pool (a per-test fixture's body)."""
        celery_app.conf.task_default_queue = self.queue
        return self

    def idle(self) -> bool:
        """Whether the pool has no task left to run: none in its queue, none running, none
        taken and waiting, none held for a countdown. A task sent in a task's bookkeeping
        (a retry, a re-check) is one of these until it has run: poll this (``wait_for``)
        before asserting that something was never done."""
        client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
        try:
            if client.llen(self.queue):
                return False
        finally:
            client.close()
        inspect = celery_app.control.inspect(destination=self.names, timeout=2)
        for held in (inspect.active(), inspect.reserved(), inspect.scheduled()):
            if held is None or len(held) < len(self.names) or any(held.values()):
                return False  # a worker that did not answer may hold one
        return True

    def stop(self) -> None:
        celery_app.conf.task_default_queue = self.previous_queue
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def worker_pool(
    count: int = 1, *, label: str, extra_env: dict[str, str] | None = None, queue: str | None = None
) -> Iterator[WorkerPool]:
    """The body of a pool fixture (``yield from worker_pool(...)``): started, then stopped."""
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    pool = WorkerPool(count, label=label, extra_env=extra_env, queue=queue)
    try:
        yield pool
    finally:
        pool.stop()


@pytest.fixture(scope="session")
def session_workers(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    # The service's own 429 pacing, and the waits journal's re-read cadence, in seconds rather
    # than minutes, so holds, releases and fail-closed recovery run fast.
    yield from worker_pool(
        2,
        label="w",
        extra_env={
            "AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS": "2000",
            "AGENTOPS_WAIT_RECHECK_MS": "1000",
        },
    )


@pytest.fixture
def workers(session_workers: WorkerPool) -> WorkerPool:
    """Two real Celery workers with the default settings; turns submitted now go to them."""
    return session_workers.routed()


@pytest.fixture
def no_workers() -> Iterator[None]:
    """Turns submitted now wait in a queue no worker consumes: a test that commits turns only
    to look at them (a websocket's first status) leaves the session's workers alone."""
    previous = celery_app.conf.task_default_queue
    celery_app.conf.task_default_queue = unconsumed = f"{QUEUE}-unconsumed"
    yield
    celery_app.conf.task_default_queue = previous
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(unconsumed)  # the turns' messages, left in the suite's Redis otherwise
    client.close()


@pytest.fixture(autouse=True)
def _workers_settle(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used workers, wait until no worker holds a turn lease (it may still be
    running the breaker or bookkeeping after the turn the test waited for ended), so the
    flush between tests does not race it."""
    yield
    marker = request.node.get_closest_marker("django_db")
    if not marker or not marker.kwargs.get("transaction"):
        return
    from inference.models import AgentLease

    poll_until(lambda: not AgentLease.objects.exists(), timeout=15)


def scraper() -> Client:
    """A client that scrapes ``/metrics`` as Prometheus is set up to: an operator token."""
    return Client(
        headers={"Authorization": f"Bearer {api_token_create(name='prometheus', operator=True)[1]}"}
    )


@pytest.fixture
def operator_token(db: None) -> str:
    return api_token_create(name="test-operator", operator=True)[1]


@pytest.fixture
def user_token(db: None) -> str:
    return api_token_create(name="test-user", operator=False)[1]


@pytest.fixture
def api(operator_token: str) -> Client:
    """A Django test client that sends an operator token."""
    return Client(headers={"Authorization": f"Bearer {operator_token}"})


@pytest.fixture
def providers(standin: str, db: None) -> dict[str, Provider]:
    """Providers pointing at the stand-in, whose record and ``times`` counters start empty."""
    httpx.delete(f"{standin}/_standin/requests")
    return {
        "openai": ProviderFactory.create(
            name="standin-openai", kind="openai", base_url=f"{standin}/v1"
        ),
        "anthropic": ProviderFactory.create(
            name="standin-anthropic", kind="anthropic", base_url=standin
        ),
    }


@pytest.fixture
def make_agent(providers: dict[str, Provider]) -> Callable[..., Agent]:
    def make(*, provider: str = "openai", model: str = "answer", **fields: Any) -> Agent:
        agent: Agent = AgentFactory.create(provider=providers[provider], model=model, **fields)
        return agent

    return make


@pytest.fixture(scope="session", autouse=True)
def _drop_stray_connections(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """Threads from async tests keep connections to the test database; end them so it can be
    dropped at the end of the session."""
    yield
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture(scope="session", autouse=True)
def runtime() -> Iterator[TurnRuntime]:
    """The test process's runtime, built as the web's lifespan builds one (not a worker's: the
    workers are processes of their own), and stopped at the end of the session. Code under
    test is handed it, as its entry point would hand it."""
    with serving(TurnRuntime(worker=False)) as made:
        yield made
