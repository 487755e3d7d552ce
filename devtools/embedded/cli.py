"""``python -m devtools.embedded up|down VAR_DIR`` (for Makefiles / shell scripts), and
``stop_all``.

::

    python -m devtools.embedded up VAR_DIR     # prints DATABASE_URL=... and REDIS_URL=...,
                                               # runs until SIGINT/SIGTERM, stops both, exit 0
    python -m devtools.embedded down VAR_DIR   # stops whatever is still running from VAR_DIR

``up`` writes its pid to ``VAR_DIR/embedded.pid``; ``down`` asks that process to stop its
servers itself (SIGTERM), then stops any server still named in the var dir's pid files. The
CLI installs its own signal handlers; nothing else in the package registers any.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from devtools.embedded.postgres import start_postgres, stop_leftover_postgres
from devtools.embedded.processes import pid_alive, process_cmdline, read_pid_file, wait_gone
from devtools.embedded.redis_server import start_redis, stop_leftover_redis
from devtools.embedded.service import DEFAULT_TIMEOUT, EmbeddedService, EmbeddedServiceError

logger = logging.getLogger(__name__)

_CLI_MARKER = "devtools.embedded"


def stop_all(var_dir: Path, *, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """Stop everything still running from ``var_dir``: an ``up`` CLI, PostgreSQL, Redis.

    Only processes named in this var dir's pid files are signalled. Returns what was stopped.
    """
    var_dir = Path(var_dir).resolve()
    stopped: list[str] = []
    cli_pid = read_pid_file(var_dir / "embedded.pid")
    if cli_pid and cli_pid != os.getpid() and pid_alive(cli_pid):
        if _CLI_MARKER in (process_cmdline(cli_pid) or ""):
            os.kill(cli_pid, signal.SIGTERM)  # it stops its servers itself, cleanly
            if not wait_gone(cli_pid, None, timeout * 2):
                raise EmbeddedServiceError(f"`up` process {cli_pid} did not exit after SIGTERM")
            stopped.append(f"up (pid {cli_pid})")
    for stop_leftover in (stop_leftover_postgres, stop_leftover_redis):
        what = stop_leftover(var_dir)
        if what is not None:
            stopped.append(what)
    return stopped


def _cmd_up(var_dir: Path, database: str, timeout: float) -> int:
    var_dir = var_dir.resolve()
    var_dir.mkdir(parents=True, exist_ok=True)
    pid_file = var_dir / "embedded.pid"
    other = read_pid_file(pid_file)
    if other and other != os.getpid() and pid_alive(other):
        if _CLI_MARKER in (process_cmdline(other) or ""):
            logger.error("already running for %s (pid %d); use `down` first", var_dir, other)
            return 1

    stop_requested = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)

    services: list[EmbeddedService] = []
    rc = 0
    try:
        pid_file.write_text(f"{os.getpid()}\n")
        services.append(start_postgres(var_dir, database=database, timeout=timeout))
        services.append(start_redis(var_dir, timeout=timeout))
        if not stop_requested.is_set():
            print(f"DATABASE_URL={services[0].url}", flush=True)
            print(f"REDIS_URL={services[1].url}", flush=True)
            logger.info("running (logs in %s/*.log); stop with SIGINT/SIGTERM", var_dir)
        while not stop_requested.wait(1.0):
            dead = [s.name for s in services if not s.is_running()]
            if dead:
                logger.error("%s exited unexpectedly, see its log in %s", ", ".join(dead), var_dir)
                rc = 1
                break
    except EmbeddedServiceError as exc:
        logger.error("%s", exc)
        rc = 1
    finally:
        for service in reversed(services):
            try:
                service.stop()
            except Exception as exc:  # keep stopping the others
                logger.error("stopping %s failed: %s", service.name, exc)
                rc = 1
        if read_pid_file(pid_file) == os.getpid():
            pid_file.unlink(missing_ok=True)
    if rc == 0:
        logger.info("stopped")
    return rc


def _cmd_down(var_dir: Path, timeout: float) -> int:
    if not var_dir.exists():
        logger.info("%s does not exist: nothing to stop", var_dir)
        return 0
    try:
        stopped = stop_all(var_dir, timeout=timeout)
    except EmbeddedServiceError as exc:
        logger.error("%s", exc)
        return 1
    logger.info("stopped: %s", ", ".join(stopped) if stopped else "nothing was running")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.embedded",
        description="Run the embedded PostgreSQL and Redis with their data under VAR_DIR.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser(
        "up", help="start both, print DATABASE_URL=/REDIS_URL= lines, run until SIGINT/SIGTERM"
    )
    up.add_argument("var_dir", type=Path, metavar="VAR_DIR")
    up.add_argument("--database", default="agentops")
    up.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT, help="start-up timeout (s)")
    down = commands.add_parser("down", help="stop whatever is still running from VAR_DIR")
    down.add_argument("var_dir", type=Path, metavar="VAR_DIR")
    down.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="devtools.embedded: %(message)s"
    )
    if args.command == "up":
        return _cmd_up(args.var_dir, args.database, args.timeout)
    return _cmd_down(args.var_dir, args.timeout)
