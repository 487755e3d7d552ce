"""Endpoint URLs: http(s) only, and no private, loopback or other non-public address unless
AGENTOPS_WEBHOOKS_ALLOW_PRIVATE is set. Checked when an endpoint is saved (model validation and
the admin form); the delivery-time check is in test_delivery."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client

from agentops.urlsafety import url_refusal
from agentops.webhooks.models import WebhookEndpoint

pytestmark = pytest.mark.django_db


@pytest.fixture
def private_refused(settings: Any) -> None:
    settings.AGENTOPS_WEBHOOKS_ALLOW_PRIVATE = False


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://127.0.0.1:8080/hook", "loopback"),
        ("http://localhost/hook", "loopback"),
        ("https://[::1]/hook", "loopback"),
        ("http://10.1.2.3/hook", "private"),
        ("http://192.168.0.10/hook", "private"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://224.0.1.1/hook", "multicast"),
        ("http://0.0.0.0/hook", "unspecified"),
        ("http://240.0.0.1/hook", "reserved"),
        ("http://100.64.0.1/hook", "non-global"),
        ("http://[::ffff:10.0.0.1]/hook", "private"),
    ],
)
def test_a_non_public_address_is_refused_and_the_error_names_the_url_field(
    private_refused: None, url: str, kind: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        WebhookEndpoint(url=url).full_clean()
    assert list(refused.value.message_dict) == ["url"]
    assert f"a {kind} address" in refused.value.message_dict["url"][0]


@pytest.mark.parametrize("url", ["ftp://8.8.8.8/hook", "file:///etc/passwd", "gopher://8.8.8.8/"])
def test_only_http_and_https_are_allowed(url: str) -> None:
    with pytest.raises(ValidationError) as refused:
        WebhookEndpoint(url=url).full_clean()
    assert "url" in refused.value.message_dict
    assert url_refusal(url, allow_private=True) is not None


def test_a_public_address_is_accepted(private_refused: None) -> None:
    WebhookEndpoint(url="https://8.8.8.8/hook").full_clean()


def test_the_setting_allows_a_loopback_receiver(settings: Any) -> None:
    settings.AGENTOPS_WEBHOOKS_ALLOW_PRIVATE = True
    WebhookEndpoint(url="http://127.0.0.1:8080/hook").full_clean()


def test_a_secret_that_is_not_whsec_base64_is_refused() -> None:
    with pytest.raises(ValidationError) as refused:
        WebhookEndpoint(url="https://8.8.8.8/hook", secret="hunter2").full_clean()
    assert list(refused.value.message_dict) == ["secret"]


def test_the_admin_form_refuses_a_loopback_url_on_the_url_field_and_saves_a_public_one(
    private_refused: None,
) -> None:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    page = client.get("/admin/webhooks/webhookendpoint/add/")
    secret = page.context["adminform"].form["secret"].initial
    assert secret.startswith("whsec_") and secret in page.content.decode()

    form = {
        "url": "http://127.0.0.1:8080/hook",
        "description": "",
        "kinds": "hard-down",
        "enabled": "on",
        "secret": secret,
    }
    response = client.post("/admin/webhooks/webhookendpoint/add/", form)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["url"] and "loopback" in errors["url"][0]
    assert not WebhookEndpoint.objects.exists()

    response = client.post(
        "/admin/webhooks/webhookendpoint/add/",
        {**form, "url": "https://8.8.8.8/hook", "kinds": "hard-down,provider-wait"},
    )
    assert response.status_code == 302
    saved = WebhookEndpoint.objects.get()
    assert (
        saved.kinds == ["hard-down", "provider-wait"] and saved.secret == secret and saved.enabled
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("answer", "saved"),
    [("8.8.8.8", True), ("10.0.0.1", False)],
)
def test_the_admin_looks_the_host_up_before_it_opens_its_transaction(
    private_refused: None, monkeypatch: pytest.MonkeyPatch, answer: str, saved: bool
) -> None:
    import socket

    from django.db import connection

    real_getaddrinfo = socket.getaddrinfo
    in_transaction: list[bool] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "hooks.example.test":
            return real_getaddrinfo(host, port, *args, **kwargs)
        in_transaction.append(connection.in_atomic_block)
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (answer, int(port)))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    secret = (
        client.get("/admin/webhooks/webhookendpoint/add/")
        .context["adminform"]
        .form["secret"]
        .initial
    )

    # No scheme: the form reads it as https, and so does the look-up ahead.
    form = {
        "url": "hooks.example.test/hook",
        "description": "",
        "kinds": "",
        "enabled": "on",
        "secret": secret,
    }
    response = client.post("/admin/webhooks/webhookendpoint/add/", form)

    assert in_transaction == [False]  # one look-up, before the admin's transaction
    if saved:
        assert (
            response.status_code == 302
            and WebhookEndpoint.objects.get().url == "https://hooks.example.test/hook"
        )
    else:
        assert "10.0.0.1, a private address" in response.context["adminform"].form.errors["url"][0]
        assert not WebhookEndpoint.objects.exists()
