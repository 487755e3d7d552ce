"""Find the embedded servers already running for a var dir, without starting anything: how a
bare ``manage.py`` (no ``DATABASE_URL``) reaches the servers ``make run`` started."""

from __future__ import annotations

from pathlib import Path

from devtools.embedded.postgres import _postmaster_is_ours, _read_postmaster_pid
from devtools.embedded.processes import pid_alive, process_name, read_pid_file, read_state
from devtools.embedded.service import HOST


def running_urls(var_dir: Path) -> dict[str, str] | None:
    """``{"DATABASE_URL", "REDIS_URL"}`` of the embedded PostgreSQL and Redis serving
    ``var_dir``, or None unless both are running there."""
    var_dir = Path(var_dir).resolve()
    pgdata = var_dir / "postgres"
    info = _read_postmaster_pid(pgdata)
    if (
        info is None
        or not info.port
        or info.status != "ready"
        or not _postmaster_is_ours(info, pgdata)
    ):
        return None
    pid = read_pid_file(var_dir / "redis" / "redis-server.pid")
    port = read_state(var_dir / "redis.json").get("port")
    if (
        pid is None
        or not port
        or not pid_alive(pid)
        or not (process_name(pid) or "").startswith("redis-server")
    ):
        return None
    return {
        "DATABASE_URL": f"postgres://postgres@{HOST}:{info.port}/agentops",
        "REDIS_URL": f"redis://{HOST}:{port}/0",
    }
