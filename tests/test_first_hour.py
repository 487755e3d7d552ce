"""The first hour on a fresh clone: ``make token`` prints only a token that authenticates,
the launcher's own messages go to stderr, and a bare ``manage.py`` with no database to reach
says how to run it instead of falling back to a default socket."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from tests.conftest import _database_url

BASE_DIR = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.django_db(transaction=True)


def _env(**changes: str | None) -> dict[str, str]:
    env = {**os.environ, "DATABASE_URL": _database_url(), "REDIS_URL": settings.REDIS_URL}
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _make_token(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-s", "token", *args],
        cwd=BASE_DIR,
        env=_env(MAKEFLAGS=None, MFLAGS=None),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )


def test_make_token_prints_one_line_an_operator_token_that_authenticates() -> None:
    done = _make_token("NAME=first-hour", "OPERATOR=1")
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout
    client = Client(headers={"Authorization": f"Bearer {lines[0]}"})
    assert client.get("/api/v1/waits").status_code == 200  # an operator endpoint
    assert (
        Client(headers={"Authorization": f"Bearer {lines[0]}x"}).get("/api/v1/agents").status_code
        == 401
    )


def test_make_token_without_operator_makes_a_token_refused_on_operator_endpoints() -> None:
    (token,) = _make_token("NAME=reader").stdout.splitlines()
    client = Client(headers={"Authorization": f"Bearer {token}"})
    assert client.get("/api/v1/agents").status_code == 200
    assert client.get("/api/v1/waits").status_code == 403


def test_make_token_with_a_project_makes_a_token_of_that_project() -> None:
    from agentops.models import ApiToken
    from agentops.tokens import api_token_check

    (token,) = _make_token("NAME=billing-bot", "PROJECT=billing").stdout.splitlines()
    found = api_token_check(token)
    assert found is not None and found.project.name == "billing" and not found.operator
    assert ApiToken.objects.get(name="billing-bot").project.name == "billing"


def test_the_launchers_own_messages_go_to_stderr_and_stdout_is_the_commands() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "devtools.launcher",
            "exec",
            "--",
            sys.executable,
            "-c",
            "print('only this')",
        ],
        cwd=BASE_DIR,
        env=_env(REDIS_URL=None),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "only this\n"
    assert "REDIS_URL is not set: " in done.stderr
    assert ("started the embedded Redis" in done.stderr) or (
        "using the embedded Redis" in done.stderr
    )
    assert "starting" not in done.stderr


def test_manage_py_without_a_database_url_or_running_servers_stops_and_says_how(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=BASE_DIR,
        env=_env(DATABASE_URL=None, AGENTOPS_VAR_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "DATABASE_URL is not set" in done.stderr
    assert "make run" in done.stderr and "devtools.launcher" in done.stderr
    assert done.stdout == ""


@pytest.mark.parametrize("setting", ["DATABASE_URL", "REDIS_URL"])
def test_make_run_with_a_server_nothing_answers_at_says_so_in_one_line(setting: str) -> None:
    import socket
    import time

    with socket.socket() as probe:  # a loopback port, closed again: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        web_port = probe.getsockname()[1]
    url = (
        f"postgres://postgres@127.0.0.1:{port}/x"
        if setting == "DATABASE_URL"
        else (f"redis://127.0.0.1:{port}/0")
    )
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "devtools.launcher", "run"],
        cwd=BASE_DIR,
        env=_env(**{setting: url, "AGENTOPS_PORT": str(web_port)}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert time.monotonic() - began < 15
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert setting in lines[0] and f"127.0.0.1:{port}" in lines[0], lines
    assert "Traceback" not in done.stderr
