"""Webhook test harness: a scripted receiver on loopback, and real Celery workers whose
webhook settings make retries take milliseconds and allow the loopback receiver."""

from __future__ import annotations

import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agentops.alerts import alert_raise
from agentops.webhooks.models import WebhookAttempt
from tests.conftest import WorkerPool, poll_until, wait_for, worker_pool
from tests.factories import WebhookEndpointFactory

# Worker settings for webhook tests: fast retries, few attempts, the loopback receiver allowed.
WORKER_ENV = {
    "AGENTOPS_WEBHOOKS_ALLOW_PRIVATE": "true",
    "AGENTOPS_WEBHOOK_RETRY_BASE_MS": "100",
    "AGENTOPS_WEBHOOK_RETRY_MAX_MS": "5000",
    "AGENTOPS_WEBHOOK_MAX_ATTEMPTS": "3",
    "AGENTOPS_WEBHOOK_TIMEOUT_MS": "3000",
}


# The kind of the alert ``worker_had_its_chance`` raises: an endpoint a test watches for what
# must not arrive is set to other kinds, so the probe never reaches it.
PROBE_KIND = "journal-act-dropped"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic() when the request was read


@dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b"ok"
    delay_s: float = 0.0  # before answering


class Receiver:
    """A real HTTP server on a loopback address (127.0.0.1 unless told) that answers each POST
    with the next scripted reply (200 once the script runs out) and records what it was sent.
    With ``tls`` it speaks https and records the server name (SNI) of each handshake."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, tls: ssl.SSLContext | None = None
    ) -> None:
        self.script: list[Reply] = []
        self.requests: list[Received] = []
        self.server_names: list[str | None] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver.lock:
                    receiver.requests.append(
                        Received(
                            self.path,
                            {k.lower(): v for k, v in self.headers.items()},
                            body,
                            time.monotonic(),
                        )
                    )
                    reply = receiver.script.pop(0) if receiver.script else Reply()
                time.sleep(reply.delay_s)  # a slow receiver: the answer itself takes this long
                self.send_response(reply.status)
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://{host}:{self.port}/hook"
        if tls is not None:
            names = self.server_names

            def sni(_sock: ssl.SSLObject, name: str | None, _ctx: ssl.SSLContext) -> None:
                names.append(name)

            tls.sni_callback = sni
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answer(self, *replies: Reply | int) -> None:
        with self.lock:
            self.script.extend(r if isinstance(r, Reply) else Reply(status=r) for r in replies)

    def received(self) -> list[Received]:
        with self.lock:
            return list(self.requests)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def worker_had_its_chance(*, retried_after_s: int | None = None) -> None:
    """Return once the webhook worker has sent an alert raised now (of ``PROBE_KIND``, to a
    receiver of its own) and, with ``retried_after_s``, sent it again that long after a 503:
    so it has taken every task queued before this call (it takes them in queue order), and run
    every countdown due before that retry. The evidence a test needs before it asserts that
    something was not sent."""
    probe = Receiver()
    try:
        if retried_after_s is not None:
            probe.answer(Reply(503, headers={"retry-after": str(retried_after_s)}))
        WebhookEndpointFactory.create(url=probe.url, kinds=[PROBE_KIND])
        alert_raise(kind=PROBE_KIND, agent="probe", message="the worker's turn came")
        sends = 1 if retried_after_s is None else 2
        wait_for(lambda: len(probe.received()) >= sends, what="the probe alert's delivery")
    finally:
        probe.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    yield made
    made.close()


@pytest.fixture(autouse=True)
def _allow_loopback(settings: Any) -> None:
    """Endpoints saved by the tests point at the loopback receiver."""
    settings.AGENTOPS_WEBHOOKS_ALLOW_PRIVATE = True


@pytest.fixture(scope="session")
def webhook_session_workers(django_db_setup: None, django_db_blocker: Any) -> Iterator[WorkerPool]:
    yield from worker_pool(1, label="wh", extra_env=WORKER_ENV)


@pytest.fixture
def webhook_workers(webhook_session_workers: WorkerPool) -> Iterator[WorkerPool]:
    """A real worker with the webhook test settings; tasks sent now go to it. Afterwards, wait
    until it has no attempt under way, so the flush between tests does not race it."""
    yield webhook_session_workers.routed()
    poll_until(
        lambda: not WebhookAttempt.objects.filter(ended_at__isnull=True).exists(), timeout=10
    )
