"""Real faults: a throwaway PostgreSQL cluster and a throwaway Redis (the project's embedded
servers, under a scratch directory) that tests stop and start, with the service's own web
process, Celery workers and beat running on them. The suite's shared servers are never touched.

The test process drives the stack from outside: HTTP to the web process, SQL (psycopg) to the
throwaway database, the stand-in's record for the calls that reached the provider.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import redis
from psycopg.rows import dict_row

from devtools.embedded.postgres import start_postgres
from devtools.embedded.processes import free_port
from devtools.embedded.redis_server import start_redis
from tests.conftest import BASE_DIR, LOG_DIR, wait_for

DATABASE = "agentops_faults"
# Short enough that today's failure modes show within a test: the lease a dead or stuck run
# holds lapses in seconds, the sweep runs every second.
FAULT_ENV = {
    "AGENTOPS_DB_POOL_TIMEOUT_MS": "1000",
    "AGENTOPS_TURN_LEASE_MS": "8000",
    "AGENTOPS_TURN_SWEEP_MS": "1000",
    "AGENTOPS_WAIT_RECHECK_MS": "1000",
    "AGENTOPS_RATE_LIMIT_PACING_FLOOR_MS": "20000",
    "AGENTOPS_CELERY_QUEUE": "agentops-faults",
}

SETUP = """
import json
from agentops.models import Provider
from agentops.tokens import api_token_create
Provider.objects.get_or_create(
    name="standin-openai", defaults={"kind": "openai", "base_url": STANDIN + "/v1"}
)
print(json.dumps({"token": api_token_create(name="faults", operator=True)[1]}))
"""


class FaultStack:
    """The throwaway servers and the service's processes on them."""

    def __init__(self, var: Path, standin: str) -> None:
        self.var = var
        self.standin = standin
        self.pg = start_postgres(var, database=DATABASE)
        self.redis = start_redis(var)
        self.env = {
            **os.environ,
            "DATABASE_URL": self.pg.url,
            "REDIS_URL": self.redis.url,
            "DJANGO_SETTINGS_MODULE": "agentops.settings",
            "AGENTOPS_FAILURES_LOG": str(var / "failures.log"),
            **FAULT_ENV,
        }
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.manage("migrate", "--noinput")
        out = self.manage("shell", "-c", SETUP.replace("STANDIN", repr(standin)))
        self.token = json.loads(out.strip().splitlines()[-1])["token"]
        self.web_url = ""

    # --- processes ------------------------------------------------------------------------

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=BASE_DIR,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def _spawn(
        self,
        name: str,
        cmd: list[str],
        extra_env: dict[str, str] | None = None,
        *,
        replace_env: bool = False,
    ) -> subprocess.Popen[bytes]:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        log = open(LOG_DIR / f"faults-{name}.log", "w")
        env = dict(extra_env or {}) if replace_env else {**self.env, **(extra_env or {})}
        proc = subprocess.Popen(cmd, cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def start_web(self) -> None:
        port = free_port(None)
        # The web process at the default pool timeout (10 s): its own short wait must make 503s
        # fast.
        web_env = {k: v for k, v in self.env.items() if k != "AGENTOPS_DB_POOL_TIMEOUT_MS"}
        self._spawn(
            "web",
            [
                sys.executable,
                "-m",
                "uvicorn",
                "interfaces.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            web_env,
            replace_env=True,
        )
        self.web_url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(f"{self.web_url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=60, what="the fault stack's web process")

    def start_worker(
        self, name: str, extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        hostname = f"{name}-{os.getpid()}@faults"
        proc = self._spawn(
            name,
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
                hostname,
                "-Q",
                FAULT_ENV["AGENTOPS_CELERY_QUEUE"],
                "--without-gossip",
                "--without-mingle",
            ],
            extra_env,
        )
        client = redis.Redis.from_url(self.redis.url)
        try:
            wait_for(
                lambda: (
                    bool(client.exists(f"agentops:worker:{hostname}")) or proc.poll() is not None
                ),
                timeout=60,
                what=f"worker {name}",
            )
        finally:
            client.close()
        assert proc.poll() is None, f"worker {name} exited; see {LOG_DIR}"
        return proc

    def start_beat(self) -> None:
        self._spawn(
            "beat",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "agentops",
                "beat",
                "-l",
                "info",
                "-s",
                str(self.var / "beat-schedule"),
            ],
        )

    def stop_process(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop_process(name, signal.SIGTERM, timeout=20)

    # --- the faults -----------------------------------------------------------------------

    def stop_postgres(self) -> None:
        self.pg.stop()

    def start_postgres(self) -> None:
        port = self.pg.port
        self.pg = start_postgres(self.var, database=DATABASE)
        assert self.pg.port == port, "the throwaway PostgreSQL came back on another port"

    def stop_redis(self) -> None:
        self.redis.stop()

    def start_redis(self) -> None:
        port = self.redis.port
        self.redis = start_redis(self.var)
        assert self.redis.port == port

    def close(self) -> None:
        self.stop_all()
        self.pg.stop()
        self.redis.stop()

    # --- reading and driving ----------------------------------------------------------------

    def sql(self, query: str, *params: Any) -> list[dict[str, Any]]:
        with psycopg.connect(
            self.pg.url, autocommit=True, row_factory=dict_row, connect_timeout=5
        ) as conn:
            cursor = conn.execute(query, params)
            return list(cursor.fetchall()) if cursor.description is not None else []

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10) -> httpx.Response:
        return httpx.request(
            method,
            f"{self.web_url}/api/v1{path}",
            json=body,
            timeout=timeout,
            headers={"Authorization": f"Bearer {self.token}"},
        )

    def reset(self) -> None:
        """Between tests: no open turn is left to a later test's workers."""
        self.sql(
            "UPDATE inference_turn SET status = 'cancelled' "
            "WHERE status IN ('queued', 'running', 'held', 'requires_action')"
        )
        self.sql("DELETE FROM inference_agentlease")


def provider_calls(standin: str, model: str) -> list[dict[str, Any]]:
    """The requests for ``model`` that reached the stand-in, oldest first."""
    requests: list[dict[str, Any]] = httpx.get(f"{standin}/_standin/requests").json()
    return [r for r in requests if r.get("model") == model]


@pytest.fixture(scope="module")
def fault_stack(standin: str) -> Iterator[FaultStack]:
    # Not tmp_path: pytest keeps /tmp/pytest-of-root at 0700, which the unprivileged
    # PostgreSQL user (when the suite runs as root) cannot traverse.
    var = Path(tempfile.mkdtemp(prefix="agentops-faults-"))
    stack: FaultStack | None = None
    try:
        stack = FaultStack(var, standin)
        stack.start_web()
        stack.start_beat()
        yield stack
    finally:
        if stack is not None:
            stack.close()
        shutil.rmtree(var, ignore_errors=True)


@pytest.fixture
def faults(fault_stack: FaultStack) -> Iterator[FaultStack]:
    """The fault stack with PostgreSQL and Redis up and no open turn; the test's own workers
    are stopped after it."""
    yield fault_stack
    for name in [n for n in fault_stack.procs if n not in ("web", "beat")]:
        fault_stack.stop_process(name, signal.SIGKILL)
    if not fault_stack.pg.is_running():
        fault_stack.start_postgres()
    if not fault_stack.redis.is_running():
        fault_stack.start_redis()
    fault_stack.reset()


def wait_turn(
    stack: FaultStack, turn_id: int, statuses: tuple[str, ...], timeout: float = 30
) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        rows = stack.sql("SELECT * FROM inference_turn WHERE id = %s", turn_id)
        return rows[0] if rows and rows[0]["status"] in statuses else None

    found: dict[str, Any] = wait_for(seen, timeout=timeout, what=f"turn {turn_id} to be {statuses}")
    return found


def submit(stack: FaultStack, agent: str, model: str, text: str = "Hi") -> int:
    created = stack.api(
        "POST", "/agents", {"name": agent, "provider": "standin-openai", "model": model}
    )
    assert created.status_code in (200, 201), created.text
    turn = stack.api(
        "POST", f"/agents/{agent}/turns", {"messages": [{"participant": "alice", "content": text}]}
    )
    assert turn.status_code in (200, 201, 202), turn.text
    return int(turn.json()["id"])


def now_s() -> float:
    return time.time()
