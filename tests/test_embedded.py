"""The embedded PostgreSQL / Redis really start, keep their data, recover and stop (no Django)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from devtools.embedded import (
    EmbeddedService,
    EmbeddedServiceError,
    start_postgres,
    start_redis,
    stop_all,
)
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def var_dir() -> Iterator[Path]:
    # Not tmp_path: pytest keeps /tmp/pytest-of-root at 0700, which the unprivileged
    # PostgreSQL account (when we run as root) could not traverse.
    path = Path(tempfile.mkdtemp(prefix="agentops-embedded-"))
    try:
        yield path
    finally:
        stop_all(path)
        shutil.rmtree(path, ignore_errors=True)


def _dead(pid: int) -> bool:
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return True
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _wait_dead(pid: int, timeout: float = 10.0) -> None:
    wait_for(lambda: _dead(pid), timeout=timeout, what=f"pid {pid} to exit")


def _notes(service: EmbeddedService) -> list[str]:
    with psycopg.connect(service.url) as conn:
        return [row[0] for row in conn.execute("SELECT note FROM notes ORDER BY id").fetchall()]


def test_data_survives_a_clean_restart(var_dir: Path) -> None:
    pg = start_postgres(var_dir)
    rd = start_redis(var_dir)
    assert pg.url.startswith("postgres://postgres@127.0.0.1:") and pg.url.endswith("/agentops")
    assert rd.url == f"redis://127.0.0.1:{rd.port}/0"
    assert (var_dir / "postgres" / "PG_VERSION").is_file()
    assert not pg.reused and not rd.reused

    with psycopg.connect(pg.url) as conn:
        conn.execute("CREATE TABLE notes (id serial PRIMARY KEY, note text NOT NULL)")
        conn.execute("INSERT INTO notes (note) VALUES ('kept')")
    client = redis.Redis.from_url(rd.url)
    client.set("held-wait", "still here")
    assert client.config_get("appendonly") == {"appendonly": "yes"}
    client.close()

    rd.stop()
    pg.stop()
    assert not pg.is_running() and not rd.is_running()
    assert not (var_dir / "postgres" / "postmaster.pid").exists()
    pg.stop()  # idempotent
    rd.stop()

    pg2 = start_postgres(var_dir)
    rd2 = start_redis(var_dir)
    try:
        assert pg2.port == pg.port and rd2.port == rd.port  # remembered ports were free
        assert _notes(pg2) == ["kept"]
        client = redis.Redis.from_url(rd2.url)
        assert client.get("held-wait") == b"still here"
        client.close()
    finally:
        rd2.stop()
        pg2.stop()


def test_recovers_from_a_crash_and_a_stale_pid_file(var_dir: Path) -> None:
    pg = start_postgres(var_dir)
    with psycopg.connect(pg.url) as conn:
        conn.execute("CREATE TABLE notes (id serial PRIMARY KEY, note text NOT NULL)")
        conn.execute("INSERT INTO notes (note) VALUES ('committed before the crash')")
    assert pg.pid is not None
    os.kill(pg.pid, signal.SIGKILL)  # crash: postmaster.pid is left behind
    _wait_dead(pg.pid)
    pid_file = var_dir / "postgres" / "postmaster.pid"
    assert pid_file.exists()

    pg2 = start_postgres(var_dir)
    assert not pg2.reused
    assert _notes(pg2) == ["committed before the crash"]
    pg.stop()  # the crashed handle is a no-op and must not touch the new server
    assert pg2.is_running()
    pg2.stop()

    # A pid file naming a live process that is not postgres (a recycled pid): removed.
    pid_file.write_text(
        f"{os.getpid()}\n{var_dir / 'postgres'}\n0\n5432\n\n127.0.0.1\n0 0\nready\n"
    )
    pg3 = start_postgres(var_dir)
    try:
        assert _notes(pg3) == ["committed before the crash"]
    finally:
        pg3.stop()


def test_running_servers_from_a_dead_caller_are_reused(var_dir: Path) -> None:
    pg = start_postgres(var_dir, database="first")
    rd = start_redis(var_dir)
    # The caller "forgets" them (as if it had crashed); a new start adopts the same servers.
    pg2 = start_postgres(var_dir, database="second")
    rd2 = start_redis(var_dir)
    assert pg2.reused and rd2.reused
    assert (pg2.pid, pg2.port, rd2.pid, rd2.port) == (pg.pid, pg.port, rd.pid, rd.port)
    assert pg2.url.endswith("/second")
    with psycopg.connect(pg2.url) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("second",)
    rd2.stop()
    pg2.stop()
    assert not pg.is_running() and not rd.is_running()
    pg.stop()
    rd.stop()


def test_redis_keeps_acknowledged_writes_when_killed(var_dir: Path) -> None:
    rd = start_redis(var_dir)
    client = redis.Redis.from_url(rd.url)
    client.set("ack", "1")
    client.close()
    assert rd.pid is not None
    os.kill(rd.pid, signal.SIGKILL)
    _wait_dead(rd.pid)
    rd.stop()

    rd2 = start_redis(var_dir)  # stale redis-server.pid is cleaned up
    try:
        client = redis.Redis.from_url(rd2.url)
        assert client.get("ack") == b"1"
        client.close()
    finally:
        rd2.stop()


def test_clear_error_when_postgres_cannot_start(var_dir: Path) -> None:
    start_postgres(var_dir).stop()
    with (var_dir / "postgres" / "postgresql.conf").open("a") as fh:
        fh.write("\nshared_buffers = 'not a size'\n")
    with pytest.raises(EmbeddedServiceError, match=r"postgres\.log") as excinfo:
        start_postgres(var_dir, timeout=20)
    assert "shared_buffers" in str(excinfo.value)  # the log tail is part of the message

    junk = var_dir / "other"
    (junk / "postgres").mkdir(parents=True)
    (junk / "postgres" / "something").write_text("not a cluster")
    with pytest.raises(EmbeddedServiceError, match="not a PostgreSQL data directory"):
        start_postgres(junk)


def _cli(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "devtools.embedded", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _read_urls(proc: subprocess.Popen[str]) -> dict[str, str]:
    assert proc.stdout is not None
    urls: dict[str, str] = {}
    for _ in range(2):
        line = proc.stdout.readline()
        assert "=" in line, (
            f"unexpected output {line!r}; stderr: {proc.stderr and proc.stderr.read()}"
        )
        key, value = line.strip().split("=", 1)
        urls[key] = value
    return urls


def test_cli_up_prints_urls_and_stops_cleanly_on_sigterm_and_down(var_dir: Path) -> None:
    up = _cli("up", str(var_dir))
    try:
        urls = _read_urls(up)
        assert set(urls) == {"DATABASE_URL", "REDIS_URL"}
        with psycopg.connect(urls["DATABASE_URL"]) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        client = redis.Redis.from_url(urls["REDIS_URL"])
        assert client.ping()
        client.close()
        # Another process adopting the servers while `up` lives must not stop them.
        shared = [start_postgres(var_dir), start_redis(var_dir)]
        assert [s.url for s in shared] == [urls["DATABASE_URL"], urls["REDIS_URL"]]
        assert all(s.reused and not s.owned for s in shared)
        for service in shared:
            service.stop()
        assert all(s.is_running() is False for s in shared)  # detached...
        with psycopg.connect(urls["DATABASE_URL"]) as conn:  # ...but the server still runs
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert up.poll() is None
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=30) == 0
    finally:
        if up.poll() is None:
            up.kill()
    assert not (var_dir / "postgres" / "postmaster.pid").exists()
    assert not (var_dir / "redis" / "redis-server.pid").exists()
    assert not (var_dir / "embedded.pid").exists()

    up = _cli("up", str(var_dir))
    try:
        _read_urls(up)
        down = _cli("down", str(var_dir))
        assert down.wait(timeout=60) == 0
        assert up.wait(timeout=30) == 0  # `down` asked `up` to stop its servers itself
    finally:
        if up.poll() is None:
            up.kill()
    assert not (var_dir / "postgres" / "postmaster.pid").exists()
    assert not (var_dir / "redis" / "redis-server.pid").exists()


NOBODY = 65534


def _python_for_nobody(env: dict[str, str]) -> str | None:
    """An interpreter the ``nobody`` account can run (a pyenv one under /root may not be)."""
    candidates = [sys.executable, f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}"]
    for python in candidates:
        try:
            probe = subprocess.run(
                [python, "-c", "import psycopg, redis"],
                user=NOBODY, group=NOBODY, extra_groups=[], cwd="/tmp", env=env,
                capture_output=True, timeout=30,
            )  # fmt: skip
        except OSError:
            continue
        if probe.returncode == 0:
            return python
    return None


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root")
def test_works_as_a_normal_user_too(var_dir: Path, request: pytest.FixtureRequest) -> None:
    site_packages = Path(psycopg.__file__).resolve().parents[1]
    # The fallback interpreter (/usr/bin/python3.11) may be an older 3.11 than the one these
    # site-packages were installed for; redis-py then imports async_timeout, which only its
    # asyncio client uses below 3.11.3 and which is not installed. A stand-in at the end of the
    # path lets it import (a real async_timeout, if installed, comes first).
    shims = Path(tempfile.mkdtemp(prefix="agentops-embedded-shims-"))
    request.addfinalizer(lambda: shutil.rmtree(shims, ignore_errors=True))
    shims.chmod(0o755)
    (shims / "async_timeout.py").write_text("from asyncio import timeout  # noqa: F401\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(map(str, (REPO, site_packages, shims))),
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": "/tmp",
    }
    python = _python_for_nobody(env)
    if python is None:
        pytest.skip("no Python interpreter with psycopg and redis-py that 'nobody' can run")
    os.chown(var_dir, NOBODY, NOBODY)
    script = (
        "import socket, sys, psycopg; from pathlib import Path;"
        "from devtools.embedded import start_postgres, start_redis;"
        "v = Path(sys.argv[1]); pg = start_postgres(v); rd = start_redis(v);"
        "psycopg.connect(pg.url).close();"
        "s = socket.create_connection(('127.0.0.1', rd.port)); s.sendall(b'PING\\r\\n');"
        "assert s.recv(7) == b'+PONG\\r\\n'; s.close();"
        "rd.stop(); pg.stop(); print('ok')"
    )
    result = subprocess.run(
        [python, "-c", script, str(var_dir)],
        user=NOBODY, group=NOBODY, extra_groups=[], cwd="/tmp", env=env,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.stdout.strip() == "ok", result.stderr
    assert (var_dir / "postgres").stat().st_uid == NOBODY
