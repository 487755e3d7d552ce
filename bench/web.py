"""What the web benches share: a database of the bench's own beside the one in DATABASE_URL,
a free loopback port, the service under one uvicorn process, waiting for a server to answer,
and the quantiles of a run."""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

BASE_DIR = Path(__file__).resolve().parent.parent


def bench_database_url(database: str) -> str:
    """DATABASE_URL with the bench's own database in its path."""
    return urlunsplit(urlsplit(os.environ["DATABASE_URL"])._replace(path=f"/{database}"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def uvicorn(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The service's ASGI app under one uvicorn process on ``port``, as production runs it."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "interfaces.asgi:application",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        cwd=BASE_DIR,
        env=env,
        stderr=subprocess.DEVNULL,
    )


def wait_up(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    end = time.monotonic() + 120
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise SystemExit(f"{what} did not start")


def quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": statistics.median(ordered), "p95": pick(0.95), "p99": pick(0.99)}
