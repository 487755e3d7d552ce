"""Settings refused by name (issue: the first hour): a bad value or an unknown key stops every
process (a management command, the web app, a worker, beat, the launcher) at its start with one
line on stderr, last, naming the setting, and exit status 2: no traceback, no default running
in its place."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import pytest

from calls.config import BoundsConfigError, parse_bounds
from tests.conftest import BASE_DIR

COMMANDS = {
    "manage.py": [sys.executable, "manage.py", "check"],
    "web": [sys.executable, "-m", "uvicorn", "interfaces.asgi:application", "--port", "0"],
    "worker": [sys.executable, "-m", "celery", "-A", "agentops", "worker", "-l", "warning"],
    "beat": [sys.executable, "-m", "celery", "-A", "agentops", "beat", "-l", "warning"],
}
REFUSED = [
    ({"AGENTOPS_WORKER_TURNS": "abc"}, "AGENTOPS_WORKER_TURNS must be a whole number, not 'abc'"),
    (
        {"AGENTOPS_WAIT_RECHECK_MS": "-5"},
        "AGENTOPS_WAIT_RECHECK_MS must be a positive number of milliseconds, not '-5'",
    ),
    (
        {"AGENTOPS_INFERENCE_BOUNDS": '{"progress_bounds": {"before_contnet_ms": 5000}}'},
        "AGENTOPS_INFERENCE_BOUNDS.progress_bounds.before_contnet_ms is not a setting "
        "(did you mean before_content_ms?",
    ),
]


def refused_in(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command,
        cwd=BASE_DIR,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "agentops.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("process", list(COMMANDS))
@pytest.mark.parametrize(("env", "says"), REFUSED, ids=["not-a-number", "negative", "unknown-key"])
def test_a_refused_setting_ends_every_process_with_one_line_naming_it_and_status_2(
    process: str, env: dict[str, str], says: str
) -> None:
    done = refused_in(COMMANDS[process], env)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("agentops: configuration error: ") and says in lines[-1], lines[-3:]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (
            {"progress_bounds": {"before_contnet_ms": 5000}},
            "progress_bounds.before_contnet_ms is not a setting (did you mean before_content_ms?",
        ),
        (
            {"absolute": 1000},
            "AGENTOPS_INFERENCE_BOUNDS.absolute is not a setting (did you mean absolute_ms?",
        ),
        (
            {"progress": {}},
            "AGENTOPS_INFERENCE_BOUNDS.progress is not a setting (did you mean progress_bounds?",
        ),
    ],
)
def test_an_unknown_key_in_the_bounds_is_refused_naming_it_and_the_one_meant(
    raw: dict[str, Any], words: str
) -> None:
    with pytest.raises(BoundsConfigError) as refused:
        parse_bounds(raw)
    assert words in str(refused.value)


def launcher(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devtools.launcher", "run"],
        cwd=BASE_DIR,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_the_launcher_refuses_a_port_that_is_not_one_in_one_line() -> None:
    done = launcher({"AGENTOPS_PORT": "notaport"})
    assert done.returncode == 2
    assert (
        done.stderr.strip().splitlines()[-1]
        == "agentops: configuration error: AGENTOPS_PORT must be a whole number, not 'notaport'"
    )


def test_the_launcher_says_at_once_that_its_port_is_taken() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = launcher({"AGENTOPS_PORT": str(port)})
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"agentops: configuration error: AGENTOPS_PORT {port} is in use by another process: "
        "stop it, or set AGENTOPS_PORT to a free port"
    )
