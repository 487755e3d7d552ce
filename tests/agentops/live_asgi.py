"""The service's ASGI app under uvicorn, as a real server in its own process on the test
database with the production settings (the connection pool of its default size)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import psutil
import redis
from django.conf import settings

from tests.conftest import BASE_DIR, LOG_DIR, QUEUE, _database_url, wait_for

# Where a server's turns go unless a test routes them to its workers: a queue of this session
# that nothing consumes and that is emptied when the server stops, so no drain task is left in
# the service's own queue for a worker started later (``make run`` in the same tree).
WEB_QUEUE = f"{QUEUE}-web"

# The process of each server running, by its base URL (for tests that watch its memory).
SERVER_PIDS: dict[str, int] = {}


def asgi_server(label: str, extra_env: dict[str, str] | None = None) -> Iterator[str]:
    """The body of a server fixture (``yield from asgi_server(...)``): yields the base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log = LOG_DIR / f"{label}-server.log"
    env = dict(
        os.environ,
        DATABASE_URL=_database_url(),
        DJANGO_SETTINGS_MODULE="agentops.settings",
        PGOPTIONS="-c deadlock_timeout=100ms",
        **{"AGENTOPS_CELERY_QUEUE": WEB_QUEUE, **(extra_env or {})},
    )
    proc = subprocess.Popen(
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
        cwd=BASE_DIR,
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, f"the server exited; see {log}"
        try:
            httpx.get(f"{base}/health", timeout=1)
        except httpx.HTTPError:
            return False
        return True

    try:
        wait_for(up, timeout=60, what="the ASGI server to answer")
        SERVER_PIDS[base] = proc.pid
        yield base
    finally:
        SERVER_PIDS.pop(base, None)
        proc.terminate()
        proc.wait(timeout=20)
        client = redis.Redis.from_url(settings.REDIS_URL)
        client.delete(WEB_QUEUE)
        client.close()


class Watch:
    """While a call runs: the most the watched processes grew (RSS over their RSS at the start)
    and, with ``web``, the slowest answer to ``path`` (a check that takes 5 s counts as 5 s),
    how many checks were made and the statuses that were not 200, sampled from a thread."""

    def __init__(self, pids: list[int], web: str | None = None, path: str = "/health/live") -> None:
        self.web, self.path = web, path
        self.processes = [psutil.Process(pid) for pid in pids]
        self.failures: list[int] = []
        self.start = {p.pid: p.memory_info().rss for p in self.processes}
        self.grown = 0
        self.slowest = 0.0
        self.checks = 0
        self._stop = threading.Event()
        self._sampled = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.is_set():
                for process in self.processes:
                    self.grown = max(
                        self.grown, process.memory_info().rss - self.start[process.pid]
                    )
                if self.web is not None:
                    began = time.monotonic()
                    try:
                        status = client.get(f"{self.web}{self.path}").status_code
                    except httpx.TimeoutException:
                        status = 0
                    if status not in (0, 200):
                        self.failures.append(status)
                    self.slowest = max(self.slowest, time.monotonic() - began)
                    self.checks += 1
                self._sampled.set()
                self._stop.wait(0.01)  # dense enough for ten checks while a fast flood lasts

    def __enter__(self) -> Watch:
        self._thread.start()
        # One sample before the watched call starts: a call faster than the thread's first
        # check would otherwise leave none (a watch that saw nothing proves nothing).
        self._sampled.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
