"""Process and file helpers shared by the embedded PostgreSQL and Redis.

Pids are only ever signalled after checking they still belong to the server we mean (alive,
not a zombie, the right executable name), so a recycled pid is never killed. ``var/*.json``
records, per server, its port and which process owns it (see ``wrap_service``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

from devtools.embedded.service import HOST, EmbeddedService, EmbeddedServiceError

logger = logging.getLogger(__name__)

PORT_ATTEMPTS = 5

StopPlan = Sequence[tuple[signal.Signals, float]]


# --------------------------------------------------------------------------------------------
# Processes


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        reaped, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our own exited child
        if reaped == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        proc_stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    fields = proc_stat.rsplit(")", 1)[-1].split()
    return not fields or fields[0] not in ("Z", "X")


def process_name(pid: int) -> str | None:
    """Executable name of ``pid`` ("postgres", "redis-server"), or None if unknown."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["ps", "-o", "comm=", "-p", str(pid)], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return os.path.basename(out) or None


def process_cmdline(pid: int) -> str | None:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        pass
    try:
        out = subprocess.run(
            ["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def wait_gone(pid: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        gone = proc.poll() is not None if proc is not None else not pid_alive(pid)
        if gone:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def shutdown_pid(
    pid: int,
    proc: subprocess.Popen[bytes] | None,
    plan: StopPlan,
    what: str,
) -> None:
    """Send each signal of ``plan`` in turn, waiting its seconds for ``pid`` to exit.

    Raises EmbeddedServiceError if it is still running after the last one.
    """
    for sig, wait in plan:
        if proc is not None and proc.poll() is not None:
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            if proc is not None:
                proc.poll()
            return
        if wait_gone(pid, proc, wait):
            return
        logger.warning("%s (pid %d) still running %.0fs after %s", what, pid, wait, sig.name)
    raise EmbeddedServiceError(f"could not stop {what} (pid {pid})")


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


# --------------------------------------------------------------------------------------------
# Ports


def free_port(remembered: int | None) -> int:
    """``remembered`` if it is still free on 127.0.0.1, else a free port the OS picks."""
    if remembered and 0 < remembered < 65536 and _port_is_free(remembered):
        return remembered
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if sys.platform.startswith("linux"):
            # As the servers do: TIME_WAIT leftovers are not "busy"; on Linux a listener still
            # is (on BSD/macOS SO_REUSEADDR would also let us bind next to a wildcard listener).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------------------------
# State and pid files, the var dir lock


def read_state(path: Path) -> dict[str, int]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, int)}


def write_state(path: Path, state: dict[str, int]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state) + "\n")
    os.replace(tmp, path)


def read_pid_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def var_lock(var_dir: Path, name: str, timeout: float) -> Iterator[None]:
    """Serialise start-ups of one service on one var dir across processes."""
    path = var_dir / f".{name}.lock"
    deadline = time.monotonic() + timeout
    with open(path, "a") as fh:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise EmbeddedServiceError(
                        f"timed out after {timeout:.0f}s waiting for {path} "
                        f"(another process is starting {name} on this var dir)"
                    ) from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# Logs


def log_tail(log_path: Path, offset: int = 0, lines: int = 20) -> str:
    try:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def open_log(log_path: Path, banner: str) -> tuple[IO[bytes], int]:
    """Open ``log_path`` for a child's output after a banner; returns it and the offset."""
    fh = open(log_path, "ab")  # handed to the child; the caller closes it
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    fh.write(f"--- devtools.embedded {stamp}: {banner} ---\n".encode())
    fh.flush()
    return fh, fh.tell()


def fail(what: str, log_path: Path, offset: int) -> EmbeddedServiceError:
    """The error to raise for a failed start: ``what``, the log's path and its last lines."""
    tail = log_tail(log_path, offset)
    detail = f"\n--- last lines of {log_path} ---\n{tail}" if tail else ""
    return EmbeddedServiceError(f"{what} (see {log_path}){detail}")


# --------------------------------------------------------------------------------------------
# The handle, and who owns the server


def wrap_service(
    name: str,
    url: str,
    port: int,
    pid: int,
    proc: subprocess.Popen[bytes] | None,
    log_path: Path,
    state_path: Path,
    stop: Callable[[], None],
) -> EmbeddedService:
    """Wrap a started/adopted server; records in ``state_path`` which process owns it.

    A server adopted while the process that started it is still alive stays that process's:
    our ``stop()`` then leaves it running. One whose owner is gone becomes ours.
    """
    owner = read_state(state_path).get("owner")
    shared = proc is None and owner is not None and owner != os.getpid() and pid_alive(owner)
    write_state(state_path, {"port": port, "owner": owner if shared and owner else os.getpid()})

    def leave_running() -> None:
        logger.info("leaving %s running: process %s started it and still uses it", name, owner)

    def probe() -> bool:
        return proc.poll() is None if proc is not None else pid_alive(pid)

    return EmbeddedService(
        name=name,
        url=url,
        port=port,
        pid=pid,
        log_path=log_path,
        reused=proc is None,
        owned=not shared,
        _stopper=leave_running if shared else stop,
        _probe=probe,
    )
