"""The launcher's readiness check of the web app it started (issue 47, item 11): a local check
never goes through the outbound proxy the environment names for the providers."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from devtools import launcher


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def local_web() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def dead_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again: nothing listens there


def test_the_readiness_check_ignores_a_dead_outbound_proxy(
    local_web: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy = f"http://127.0.0.1:{dead_port()}"
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    launcher._wait_http(f"{local_web}/health", timeout=5, children=[])  # returns: it answered


CHILD = """
import signal, sys, time
def on(sig, _):
    print("SIGINT" if sig == signal.SIGINT else "SIGTERM", flush=True)
    if sig == signal.SIGINT:
        time.sleep(0.5)  # a warm shutdown: the work in hand finishes
        sys.exit(0)
signal.signal(signal.SIGINT, on)
signal.signal(signal.SIGTERM, on)
print("ready", flush=True)
while True:
    signal.pause()  # until a signal; a SIGTERM's handler returns, and it waits again
"""


def test_children_a_ctrl_c_reached_are_not_sent_a_second_stop() -> None:
    """A Ctrl-C reaches every process of the terminal; the launcher then only waits for them
    (Celery printed "Warm shutdown" twice, once for the Ctrl-C and once for the SIGTERM)."""
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGINT)  # as the terminal does
    launcher._stop_children([child], interrupted=True)  # type: ignore[list-item]
    assert child.stdout.read().split() == ["SIGINT"]
    assert child.returncode == 0


SLOW_CHILD = """
import signal, sys, time
def on(sig, _):
    print("SIGINT" if sig == signal.SIGINT else "SIGTERM", flush=True)
    if sig == signal.SIGINT:
        time.sleep(10)  # a warm shutdown that takes its time
    sys.exit(0)
signal.signal(signal.SIGINT, on)
signal.signal(signal.SIGTERM, on)
print("ready", flush=True)
while True:
    signal.pause()  # until a signal, whose handler ends the process
"""


def test_a_second_ctrl_c_while_stopping_hurries_the_children_and_the_launcher_still_stops() -> None:
    """Another Ctrl-C while the children finish their warm shutdown: they are sent SIGTERM at
    once, and the launcher waits for them and says it stopped (it once ended at once with
    status 130, "make: *** Error 130", no "stopped.")."""
    import signal
    import subprocess
    import sys
    import time

    # A Ctrl-C is a KeyboardInterrupt in the launcher, as Python starts it; a test run before
    # this one in the same process may have left another handler.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", SLOW_CHILD], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGINT)  # the terminal's first Ctrl-C
        threading.Timer(0.5, signal.raise_signal, [signal.SIGINT]).start()  # and the second
        began = time.monotonic()
        launcher._stopped([child], interrupted=True)  # type: ignore[list-item]
        assert child.returncode is not None  # gone when it returns, and it did return
        assert time.monotonic() - began < 5  # hurried: not the 10 s warm shutdown
    finally:
        signal.signal(signal.SIGINT, previous)
