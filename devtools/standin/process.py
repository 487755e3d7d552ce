"""Run the stand-in provider as a subprocess (for test harnesses and scripts).

>>> with StandinProcess() as standin:          # doctest: +SKIP
...     standin.base_url                          # "http://127.0.0.1:40123"
...     standin.openai_base_url                   # "http://127.0.0.1:40123/v1"
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType

from devtools.standin.listening import LISTENING_PREFIX

#: The directory that holds the ``inference`` package.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


class StandinError(RuntimeError):
    """The stand-in subprocess failed to start."""


class StandinProcess:
    """``python -m devtools.standin --port 0`` with its port parsed from stdout."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        python: str = sys.executable,
        startup_timeout: float = 20.0,
        log_level: str = "warning",
    ) -> None:
        self.host = host
        self.port = port
        self.python = python
        self.startup_timeout = startup_timeout
        self.log_level = log_level
        self.base_url = ""
        self.process: subprocess.Popen[str] | None = None

    @property
    def openai_base_url(self) -> str:
        """``base_url`` for the ``openai`` SDK (``.../v1``)."""
        return f"{self.base_url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        """``base_url`` for the ``anthropic`` SDK (no ``/v1``)."""
        return self.base_url

    def start(self) -> str:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH", "")) if p
        )
        env["PYTHONUNBUFFERED"] = "1"
        command = [
            self.python,
            "-m",
            "devtools.standin",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--log-level",
            self.log_level,
        ]
        self.process = subprocess.Popen(
            command, cwd=PROJECT_ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        lines: queue.Queue[str] = queue.Queue()
        stdout = self.process.stdout
        assert stdout is not None

        def read() -> None:
            for line in stdout:
                lines.put(line)
            lines.put("")

        threading.Thread(target=read, name="standin-stdout", daemon=True).start()
        try:
            line = lines.get(timeout=self.startup_timeout)
        except queue.Empty:
            self.stop()
            raise StandinError(
                f"stand-in did not report listening in {self.startup_timeout}s"
            ) from None
        if not line.startswith(LISTENING_PREFIX):
            code = self.stop()
            raise StandinError(f"stand-in failed to start (exit {code}): {line!r}")
        self.base_url = line[len(LISTENING_PREFIX) :].strip()
        self.port = int(self.base_url.rsplit(":", 1)[1])
        return self.base_url

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit status."""
        process = self.process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
        return process.returncode

    def __enter__(self) -> StandinProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
