"""The service's ASGI app under uvicorn, as a real server in its own process on the test
database with the production settings (the connection pool of its default size)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx

from tests.conftest import BASE_DIR, LOG_DIR, _database_url, wait_for

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
        **(extra_env or {}),
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
