"""The ``asgi_server`` fixture for browser tests that need websockets: uvicorn serving
``agentops.asgi:application`` on the test database and this Redis, in its own process
(pytest-django's ``live_server`` is WSGI and serves no websocket)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import BASE_DIR, LOG_DIR, _database_url, wait_for


@pytest.fixture
def asgi_server(transactional_db: None) -> Iterator[str]:
    """Yields the base URL of a uvicorn serving the ASGI app."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, DATABASE_URL=_database_url(), DJANGO_SETTINGS_MODULE="agentops.settings")
    log = open(LOG_DIR / "browser-uvicorn.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "agentops.asgi:application", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=BASE_DIR, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, f"uvicorn exited; see {LOG_DIR / 'browser-uvicorn.log'}"
        try:
            return httpx.get(f"{base}/health", timeout=2).status_code < 500
        except httpx.HTTPError:
            return False

    wait_for(up, timeout=30, what="uvicorn to answer")
    yield base
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()
