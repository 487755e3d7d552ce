"""`make run` and `make test`: start what is missing, then the service or the suite.

With DATABASE_URL / REDIS_URL unset, a real PostgreSQL and Redis are started from Python wheels
under ./var/ (devtools.embedded) and stopped again on the way out. Nothing here imports Django
settings: they read the URLs this module puts in the environment.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from agentops.conf import ConfigError, env_port
from devtools.embedded import EmbeddedService, start_postgres, start_redis

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"
PY = sys.executable


def dev_secret_key(var_dir: Path) -> str:
    """This checkout's own secret key, made at random once and kept under ``var_dir`` (so
    admin sessions outlive a restart): never a default anyone else knows."""
    kept = var_dir / "secret-key"
    if not kept.exists():
        kept.touch(mode=0o600)
        kept.write_text(secrets.token_urlsafe(50))
    return kept.read_text().strip()


def _services(env: dict[str, str]) -> list[EmbeddedService]:
    started: list[EmbeddedService] = []
    if not env.get("DATABASE_URL"):
        pg = start_postgres(VAR_DIR)
        _say(
            f"DATABASE_URL is not set: {_verb(pg)} the embedded PostgreSQL "
            f"under var/postgres ({pg.url})"
        )
        started.append(pg)
        env["DATABASE_URL"] = pg.url
    if not env.get("REDIS_URL"):
        try:
            rd = start_redis(VAR_DIR)
        except BaseException:
            for service in started:
                service.stop()
            raise
        _say(f"REDIS_URL is not set: {_verb(rd)} the embedded Redis under var/redis ({rd.url})")
        started.append(rd)
        env["REDIS_URL"] = rd.url
    return started


def _say(message: str) -> None:
    """The launcher's own messages go to stderr: stdout is the command's
    (``TOKEN=$(make token)``)."""
    print(message, file=sys.stderr, flush=True)


def _verb(service: EmbeddedService) -> str:
    return "using" if service.reused else "started"


def _start_standin(env: dict[str, str], port: int) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [PY, "-m", "devtools.standin", "--host", "127.0.0.1", "--port", str(port)],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("standin listening on "):
        proc.kill()
        raise SystemExit(f"the stand-in provider did not start (it printed {line!r})")
    return proc, line.removeprefix("standin listening on ")


def _port_taken(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


# How long the launcher waits for the database and Redis servers to accept a connection.
REACH_TIMEOUT_S = 5.0


def _servers_answer(env: dict[str, str]) -> None:
    """The database and Redis servers the URLs name accept a connection, or one line says
    which setting names what nothing answers at: not the tracebacks migrate and the web app's
    readiness check print after their own timeouts (13 s and 35 s)."""
    for name, default_port in (("DATABASE_URL", 5432), ("REDIS_URL", 6379)):
        url = urlsplit(env.get(name, ""))
        host = url.hostname
        if not host:  # a Unix socket (or no URL): the server's own client says what is wrong
            continue
        try:
            port = url.port or default_port
        except ValueError:
            continue  # a malformed port: the settings refuse it in their own words
        try:
            socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
        except OSError as exc:
            if isinstance(exc, socket.gaierror):
                why = f"the host name {host} does not resolve"
            elif isinstance(exc, TimeoutError):
                why = f"no answer within {REACH_TIMEOUT_S:.0f} s"
            else:
                why = exc.strerror or str(exc) or type(exc).__name__
            raise ConfigError(
                f"{name}: nothing answers at {host}:{port} ({why}); start that server or "
                f"correct {name} (unset, make run starts an embedded one)"
            ) from None


def run(env: dict[str, str]) -> int:
    env.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")
    env.setdefault("PYTHONUNBUFFERED", "1")
    port, standin_port = (
        env_port("AGENTOPS_PORT", 8000),
        env_port("AGENTOPS_STANDIN_PORT", 0, any_free=True),
    )
    if _port_taken(port):
        raise ConfigError(
            f"AGENTOPS_PORT {port} is in use by another process: "
            "stop it, or set AGENTOPS_PORT to a free port"
        )
    _servers_answer(env)
    children: list[subprocess.Popen[str]] = []
    try:
        # The first process to load the settings: a refused one says so in one line and ends
        # the run. (In the try: a Ctrl-C while it migrates stops the run as any other does.)
        migrated = subprocess.run(
            [PY, "manage.py", "migrate", "--noinput", "-v", "0"], cwd=BASE_DIR, env=env, check=False
        )
        if migrated.returncode:
            return migrated.returncode
        standin, standin_url = _start_standin(env, standin_port)
        children.append(standin)
        seeded = subprocess.run(
            [
                PY,
                "manage.py",
                "seed_demo",
                "--standin-url",
                standin_url,
                "--credentials",
                str(VAR_DIR / "demo-credentials.json"),
            ],
            cwd=BASE_DIR,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        sys.stdout.write(seeded.stdout)
        creds = json.loads((VAR_DIR / "demo-credentials.json").read_text())
        commands = [
            [
                PY,
                "-m",
                "uvicorn",
                "interfaces.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            [
                PY,
                "-m",
                "celery",
                "-A",
                "agentops",
                "worker",
                "-l",
                "info",
                "-c",
                "2",
                "-n",
                "agentops-worker@%h",
            ],
            [
                PY,
                "-m",
                "celery",
                "-A",
                "agentops",
                "beat",
                "-l",
                "info",
                "-s",
                str(VAR_DIR / "celerybeat-schedule"),
            ],
        ]
        for command in commands:
            children.append(subprocess.Popen(command, cwd=BASE_DIR, env=env, text=True))
        base = f"http://127.0.0.1:{port}"
        _wait_http(f"{base}/health", timeout=30, children=children)
        token = creds["api_token"]
        print(
            "\n".join(
                [
                    "",
                    "agentops is running. Ctrl-C stops everything this command started.",
                    f"  API:        {base}/api/v1/   (docs: {base}/api/v1/docs)",
                    (
                        f"  admin:      {base}/admin/    "
                        f"(user {creds['admin_user']}, password {creds['admin_password']})"
                    ),
                    (
                        f"  dashboard:  {base}/dashboard/ (live; log in as the admin user; "
                        "the README's Dashboard section fills it with demo turns)"
                    ),
                    f"  stand-in:   {standin_url}",
                    f"  API token:  {token}   (operator; kept in var/demo-credentials.json)",
                    "",
                    "Submit a turn to the demo agent:",
                    (
                        f"  curl -s -X POST {base}/api/v1/agents/demo/turns "
                        f"-H 'Authorization: Bearer {token}' "
                        "-H 'Content-Type: application/json' "
                        '-d \'{"messages": [{"participant": "alice", "content": "Hello there"}]}\''
                    ),
                    "Then read the answer (use the id it printed):",
                    f"  curl -s {base}/api/v1/turns/ID -H 'Authorization: Bearer {token}'",
                    (
                        f"  curl -s {base}/api/v1/agents/demo/history "
                        f"-H 'Authorization: Bearer {token}'"
                    ),
                    "",
                ]
            ),
            flush=True,
        )
        while all(child.poll() is None for child in children):
            time.sleep(0.5)
        # A Ctrl-C reaches every process of the terminal at once: a child may be seen gone
        # before this process's own interrupt is handled. Give it a moment to arrive.
        time.sleep(1.0)
        failed = [
            " ".join(map(str, c.args))  # type: ignore[arg-type]
            for c in children
            if c.poll() is not None
        ]
        _say(f"a process of the service stopped on its own ({failed[0]}); stopping the rest")
        return 1
    except KeyboardInterrupt as stop:
        _say("\nstopping…")
        # A Ctrl-C reached every process of the terminal: each is stopping already.
        _stopped(children, interrupted=not isinstance(stop, Terminated))
        _say("stopped.")
        return 0
    finally:
        _stop_children(children)


def _wait_http(url: str, *, timeout: float, children: list[subprocess.Popen[str]]) -> None:
    import urllib.request

    # The service is on this machine: never through an outbound proxy from the environment
    # (HTTP_PROXY is for the providers; a dead one made the check fail and `make run` stop).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        gone = [c for c in children if c.poll() is not None]
        if gone:  # its own error is on stderr above: say which, and stop
            command = " ".join(map(str, gone[0].args))  # type: ignore[arg-type]
            raise SystemExit(
                f"{command} exited (status {gone[0].returncode}) before the service was up"
            )
        try:
            with opener.open(url, timeout=2):
                return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"the web app did not answer {url} within {timeout:.0f} s")


class Terminated(KeyboardInterrupt):
    """The launcher's own SIGTERM (from a supervisor): unlike a Ctrl-C, its children got none."""


def _terminated(*_: object) -> None:
    raise Terminated()


# How long children that a Ctrl-C reached get to stop on their own before a SIGTERM.
INTERRUPTED_GRACE_S = 15.0


def _stopped(children: list[subprocess.Popen[str]], *, interrupted: bool) -> None:
    """Stop the children after a Ctrl-C or SIGTERM, and return only once they are gone. Another
    Ctrl-C meanwhile (someone impatient with a worker's warm shutdown) hurries them, SIGTERM at
    once and then SIGKILL, but never ends the launcher first: it escaped as an exit status of
    130 ("make: *** Error 130"), with no "stopped." and children maybe still running."""
    hurried = 0
    while True:
        try:
            if hurried >= 2:
                for child in children:
                    if child.poll() is None:
                        child.kill()
            _stop_children(children, interrupted=interrupted and not hurried)
            return
        except KeyboardInterrupt:
            hurried += 1
            _say("stopping at once…" if hurried == 1 else "killing what is left…")


def _stop_children(children: list[subprocess.Popen[str]], *, interrupted: bool = False) -> None:
    """Stop the children: SIGTERM, then SIGKILL after 15 s. ``interrupted``: the terminal's
    Ctrl-C reached them too and they are stopping already; a SIGTERM on top would start a
    second shutdown (Celery printed "Warm shutdown" twice), so it goes only to one still
    running after INTERRUPTED_GRACE_S."""
    if interrupted:
        end = time.monotonic() + INTERRUPTED_GRACE_S
        for child in children:
            try:
                child.wait(timeout=max(end - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                break
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    end = time.monotonic() + 15
    for child in children:
        try:
            child.wait(timeout=max(end - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("run", "test", "exec"):
        print(
            "usage: python -m devtools.launcher run | test [-- pytest args] | exec -- COMMAND...",
            file=sys.stderr,
        )
        return 2
    env = dict(os.environ)
    # The stand-in provider (make run, the tests) listens on loopback.
    env.setdefault("AGENTOPS_PROVIDERS_ALLOW_PRIVATE", "true")
    VAR_DIR.mkdir(exist_ok=True)
    if not env.get("DJANGO_SECRET_KEY"):
        env["DJANGO_SECRET_KEY"] = dev_secret_key(VAR_DIR)
    services = _services(env)
    # The launcher's own SIGTERM (from a supervisor) is handled like Ctrl-C.
    signal.signal(signal.SIGTERM, _terminated)
    try:
        rest = [a for a in argv[1:] if a]
        if rest and rest[0] == "--":
            rest = rest[1:]
        if argv[0] == "test":
            return subprocess.call([PY, "-m", "pytest", *rest], cwd=BASE_DIR, env=env)
        if argv[0] == "exec":
            return subprocess.call(rest, cwd=BASE_DIR, env=env)
        return run(env)
    except KeyboardInterrupt:
        return 130
    finally:
        for service in reversed(services):
            service.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
