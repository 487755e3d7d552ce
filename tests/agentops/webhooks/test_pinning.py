"""An attempt resolves the endpoint's host once and connects to the address it checked (no DNS
rebinding between the check and the connection), keeping the name for the Host header, TLS SNI
and certificate verification.

DNS and routing are faked at the process edge only (``socket.getaddrinfo`` and asyncio's
socket connect, which the sender's aiohttp uses): the fake network answers a name with a public
address, then with a different one, and carries connections for that public address to a
loopback receiver.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import trustme
import uvloop
from django.utils import timezone

from agentops.urlsafety import IPAddress, url_vet
from agentops.webhooks.models import WebhookAttempt, WebhookDelivery
from agentops.webhooks.sender import post_signed
from agentops.webhooks.services import alert_payload, webhook_delivery_attempt
from tests.factories import AlertFactory, WebhookDeliveryFactory, WebhookEndpointFactory
from turns.runtime import TurnRuntime

from .conftest import Receiver

pytestmark = pytest.mark.django_db

NAME = "hooks.example.test"
PUBLIC = "8.8.8.8"  # what the name answers first; the fake network routes it to loopback


@dataclass
class FakeNetwork:
    """DNS answers for NAME, one list per lookup (the last repeats), and routes from addresses
    to loopback; every other name and address goes to the real socket functions."""

    answers: list[list[str]]
    routes: dict[str, str] = field(default_factory=dict)
    lookups: list[str] = field(default_factory=list)
    connections: list[tuple[str, int]] = field(default_factory=list)


@pytest.fixture
def network(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNetwork]:
    fake = FakeNetwork(answers=[])
    real_getaddrinfo = socket.getaddrinfo
    # (The sender runs on the process's background loop, a uvloop loop.)
    real_sock_connect = uvloop.Loop.sock_connect

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != NAME:
            return real_getaddrinfo(host, port, *args, **kwargs)
        fake.lookups.append(host)
        answer = fake.answers[min(len(fake.lookups), len(fake.answers)) - 1]
        return [
            (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, int(port)))
            for a in answer
        ]

    async def sock_connect(loop: Any, sock: socket.socket, address: tuple[str, int]) -> None:
        fake.connections.append((address[0], address[1]))
        host = fake.routes.get(address[0], address[0])
        await real_sock_connect(loop, sock, (host, *address[1:]))

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(uvloop.Loop, "sock_connect", sock_connect)
    yield fake


def queued_delivery(url: str) -> WebhookDelivery:
    endpoint = WebhookEndpointFactory.create(url=url)
    alert = AlertFactory.create(kind="hard-down", agent="ada", model="m1", message="down")
    return WebhookDeliveryFactory.create(
        endpoint=endpoint, alert=alert, payload=alert_payload(alert), next_attempt_at=timezone.now()
    )


def test_an_attempt_connects_to_the_address_it_checked_even_if_the_name_answers_differently_later(
    runtime: TurnRuntime, settings: Any, network: FakeNetwork
) -> None:
    settings.AGENTOPS_WEBHOOKS_ALLOW_PRIVATE = False
    checked = Receiver("127.0.0.1")  # reached through the route for the public address
    rebound = Receiver("127.0.0.2", checked.port)  # what a second lookup of the name would reach
    try:
        network.answers = [[PUBLIC], ["127.0.0.2"]]
        network.routes = {PUBLIC: "127.0.0.1"}
        delivery = queued_delivery(f"http://{NAME}:{checked.port}/hook?token=t")

        status = webhook_delivery_attempt(runtime, delivery_id=delivery.pk)

        assert rebound.received() == []
        [request] = checked.received()
        assert (
            request.headers["host"] == f"{NAME}:{checked.port}" and request.path == "/hook?token=t"
        )
        assert network.lookups == [NAME]
        assert network.connections == [(PUBLIC, checked.port)]
        assert status == WebhookDelivery.Status.DELIVERED
    finally:
        checked.close()
        rebound.close()


def test_a_name_that_resolves_to_a_private_address_is_sent_nothing(
    runtime: TurnRuntime, settings: Any, network: FakeNetwork, receiver: Receiver
) -> None:
    settings.AGENTOPS_WEBHOOKS_ALLOW_PRIVATE = False
    network.answers = [["127.0.0.1"]]
    delivery = queued_delivery(f"http://{NAME}:{receiver.port}/hook")

    status = webhook_delivery_attempt(runtime, delivery_id=delivery.pk)

    assert status == WebhookDelivery.Status.FAILED
    delivery.refresh_from_db()
    assert f"{NAME} resolves to 127.0.0.1, a loopback address" in delivery.last_error
    assert WebhookAttempt.objects.get(delivery=delivery).outcome == WebhookAttempt.Outcome.REFUSED
    assert receiver.received() == [] and network.connections == []


def test_an_address_that_refuses_the_connection_is_passed_over_for_the_next_checked_one(
    runtime: TurnRuntime, network: FakeNetwork, receiver: Receiver
) -> None:
    closed = Receiver("127.0.0.2", receiver.port)
    closed.close()  # nothing listens on 127.0.0.2 at that port now
    network.answers = [["127.0.0.2", "127.0.0.1"]]
    vetted = url_vet(f"http://{NAME}:{receiver.port}/hook", allow_private=True)

    answer = post_signed(
        runtime,
        url=f"http://{NAME}:{receiver.port}/hook",
        addresses=vetted.addresses,
        headers={},
        body=b"{}",
        timeout_s=3,
    )

    assert answer.status_code == 200
    assert network.connections == [("127.0.0.2", receiver.port), ("127.0.0.1", receiver.port)]
    assert len(receiver.received()) == 1


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def tls_receiver(authority: trustme.CA, certified_name: str) -> Receiver:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert(certified_name).configure_cert(context)
    return Receiver("127.0.0.1", tls=context)


def client_trusting(authority: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    authority.configure_trust(context)
    return context


def loopback() -> tuple[IPAddress, ...]:
    return url_vet("http://127.0.0.1/", allow_private=True).addresses


def test_over_https_the_name_goes_in_sni_and_the_certificate_is_verified_against_it(
    runtime: TurnRuntime,
    authority: trustme.CA,
) -> None:
    receiver = tls_receiver(authority, NAME)
    try:
        answer = post_signed(
            runtime,
            url=f"https://{NAME}:{receiver.port}/hook",
            addresses=loopback(),
            headers={},
            body=b"{}",
            timeout_s=3,
            verify=client_trusting(authority),
        )
        assert (answer.status_code, answer.error) == (200, "")
        assert receiver.server_names == [NAME]
        assert receiver.received()[0].headers["host"] == f"{NAME}:{receiver.port}"
    finally:
        receiver.close()


def test_over_https_a_certificate_for_another_name_is_refused(
    runtime: TurnRuntime, authority: trustme.CA
) -> None:
    receiver = tls_receiver(authority, "other.example.test")
    try:
        answer = post_signed(
            runtime,
            url=f"https://{NAME}:{receiver.port}/hook",
            addresses=loopback(),
            headers={},
            body=b"{}",
            timeout_s=3,
            verify=client_trusting(authority),
        )
        assert answer.status_code is None and "CERTIFICATE_VERIFY_FAILED" in answer.error
        assert receiver.received() == []
    finally:
        receiver.close()
