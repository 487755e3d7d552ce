"""What must not leak: an endpoint's secret, and its URL's credentials or query, to users who may
only view endpoints (in the admin's list, page and search), and the URL's credentials or query
into logs, audit entries and messages (the request itself still carries them)."""

from __future__ import annotations

import base64
import logging
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from agentops.exceptions import Conflict
from agentops.models import AuditEntry
from agentops.webhooks.models import WebhookDelivery, WebhookEndpoint
from agentops.webhooks.services import (
    alert_payload,
    webhook_delivery_attempt,
    webhook_delivery_resend,
)
from interfaces.admin.webhooks import URL_HIDDEN
from tests.factories import AlertFactory, WebhookDeliveryFactory, WebhookEndpointFactory
from turns.runtime import TurnRuntime

from .conftest import Receiver, Reply

pytestmark = pytest.mark.django_db

PASSWORD, TOKEN = "hunter2pw", "s3cr3ttoken"


def staff(name: str, *codenames: str) -> Client:
    user = User.objects.create_user(name, password="x", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def queued_delivery(url: str, **fields: Any) -> WebhookDelivery:
    endpoint = WebhookEndpointFactory.create(url=url)
    alert = AlertFactory.create(kind="hard-down", agent="ada", model="m1", message="down")
    return WebhookDeliveryFactory.create(
        endpoint=endpoint,
        alert=alert,
        payload=alert_payload(alert),
        next_attempt_at=timezone.now(),
        **fields,
    )


def test_the_secret_is_shown_only_to_users_who_may_change_endpoints() -> None:
    endpoint = WebhookEndpointFactory.create(url="https://8.8.8.8/hook")
    page = f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/"

    viewed = staff("viewer", "view_webhookendpoint").get(page)
    assert viewed.status_code == 200
    assert (
        endpoint.secret not in viewed.content.decode()
        and "hidden: shown to users who may change" in viewed.content.decode()
    )
    assert "https://8.8.8.8/hook" in viewed.content.decode()  # the rest of the endpoint is there

    changed = staff("changer", "view_webhookendpoint", "change_webhookendpoint").get(page)
    assert changed.status_code == 200 and endpoint.secret in changed.content.decode()


def test_a_refused_attempt_logs_the_url_without_its_credentials_or_query(
    runtime: TurnRuntime, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.AGENTOPS_WEBHOOKS_ALLOW_PRIVATE = False
    delivery = queued_delivery(f"http://ops:{PASSWORD}@127.0.0.1:9/hook?token={TOKEN}")

    with caplog.at_level(logging.WARNING, logger="webhooks"):
        assert (
            webhook_delivery_attempt(runtime, delivery_id=delivery.pk)
            == WebhookDelivery.Status.FAILED
        )

    assert "http://127.0.0.1:9/hook" in caplog.text and "loopback" in caplog.text
    assert PASSWORD not in caplog.text and TOKEN not in caplog.text and "ops:" not in caplog.text


def test_a_failed_attempt_logs_the_url_without_its_credentials_or_query_but_sends_them(
    runtime: TurnRuntime, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    receiver.answer(Reply(400, body=b"no"))
    plain = receiver.url
    delivery = queued_delivery(
        plain.replace("http://", f"http://ops:{PASSWORD}@") + f"?token={TOKEN}"
    )

    with caplog.at_level(logging.WARNING, logger="webhooks"):
        assert (
            webhook_delivery_attempt(runtime, delivery_id=delivery.pk)
            == WebhookDelivery.Status.FAILED
        )

    [request] = receiver.received()
    assert request.path == f"/hook?token={TOKEN}"
    assert (
        request.headers["authorization"]
        == "Basic " + base64.b64encode(f"ops:{PASSWORD}".encode()).decode()
    )
    assert plain in caplog.text and "HTTP 400" in caplog.text
    assert PASSWORD not in caplog.text and TOKEN not in caplog.text


def test_a_resend_audits_the_url_without_its_credentials_or_query() -> None:
    delivery = queued_delivery(
        f"https://ops:{PASSWORD}@8.8.8.8:8443/hook?token={TOKEN}",
        status=WebhookDelivery.Status.FAILED,
    )

    webhook_delivery_resend(delivery_id=delivery.pk, actor="admin:op", now=timezone.now())

    [entry] = AuditEntry.objects.filter(action="webhook.resend")
    assert entry.data["endpoint"] == "https://8.8.8.8:8443/hook"
    assert (
        str(delivery.endpoint) == "https://8.8.8.8:8443/hook"
    )  # what the admin's change log records


def test_refusing_a_resend_to_a_disabled_endpoint_names_the_url_without_its_credentials_or_query() -> (
    None
):
    delivery = queued_delivery(
        f"https://ops:{PASSWORD}@8.8.8.8/hook?token={TOKEN}", status=WebhookDelivery.Status.FAILED
    )
    WebhookEndpoint.objects.filter(pk=delivery.endpoint_id).update(enabled=False)

    with pytest.raises(Conflict) as refused:
        webhook_delivery_resend(delivery_id=delivery.pk, actor="admin:op", now=timezone.now())

    assert "https://8.8.8.8/hook is disabled" in refused.value.message
    assert PASSWORD not in refused.value.message and TOKEN not in refused.value.message


def test_the_admin_change_log_names_the_endpoint_without_its_credentials_or_query() -> None:
    endpoint = WebhookEndpointFactory.create(
        url=f"https://ops:{PASSWORD}@8.8.8.8/hook?token={TOKEN}"
    )
    client = staff("changer", "view_webhookendpoint", "change_webhookendpoint")
    form = {
        "url": endpoint.url,
        "description": "renamed",
        "kinds": "",
        "enabled": "on",
        "secret": endpoint.secret,
    }

    response = client.post(f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/", form)

    assert response.status_code == 302
    [entry] = LogEntry.objects.all()
    assert entry.object_repr == "https://8.8.8.8/hook"


@pytest.mark.parametrize(
    ("url", "logged"),
    [
        ("https://ops:pw@[::1]:8443/a/b?token=t#frag", "https://[::1]:8443/a/b"),
        ("http://ops@hooks.example.test/hook?x=1", "http://hooks.example.test/hook"),
        ("https://hooks.example.test", "https://hooks.example.test"),
        ("http://[::1/hook", "(a URL that does not parse)"),
    ],
)
def test_the_logged_form_of_a_url_keeps_scheme_host_port_and_path_only(
    url: str, logged: str
) -> None:
    from agentops.urlsafety import url_for_log

    assert url_for_log(url) == logged


ENDPOINTS = "/admin/webhooks/webhookendpoint/"
FRAGMENT = "fr4gtoken"


def endpoint_with_a_token_in_its_url() -> WebhookEndpoint:
    return WebhookEndpointFactory.create(
        url=f"https://ops:{PASSWORD}@8.8.8.8:8443/hook?token={TOKEN}#{FRAGMENT}"
    )


def test_a_user_who_may_only_view_endpoints_sees_their_urls_without_credentials_or_query() -> None:
    endpoint = endpoint_with_a_token_in_its_url()
    viewer = staff("viewer", "view_webhookendpoint")

    for page in (ENDPOINTS, f"{ENDPOINTS}{endpoint.pk}/change/"):
        response = viewer.get(page)
        assert response.status_code == 200, page
        html = response.content.decode()
        assert f"https://8.8.8.8:8443/hook ({URL_HIDDEN})" in html, page
        assert (
            PASSWORD not in html
            and TOKEN not in html
            and "ops:" not in html
            and FRAGMENT not in html
        ), page


def test_a_user_who_may_change_endpoints_sees_their_full_urls() -> None:
    endpoint = endpoint_with_a_token_in_its_url()
    changer = staff("changer", "view_webhookendpoint", "change_webhookendpoint")

    listed = changer.get(ENDPOINTS)
    assert listed.status_code == 200 and endpoint.url in listed.content.decode()
    page = changer.get(f"{ENDPOINTS}{endpoint.pk}/change/")
    assert page.status_code == 200
    assert page.context["adminform"].form["url"].value() == endpoint.url
    assert endpoint.url in page.content.decode() and URL_HIDDEN not in page.content.decode()


def test_a_url_without_credentials_or_query_is_shown_to_a_viewer_as_it_is() -> None:
    WebhookEndpointFactory.create(url="https://8.8.8.8/hook")

    html = staff("viewer", "view_webhookendpoint").get(ENDPOINTS).content.decode()

    assert "https://8.8.8.8/hook" in html and URL_HIDDEN not in html


def test_a_viewer_cannot_find_an_endpoint_or_its_deliveries_by_the_hidden_part_of_its_url() -> None:
    delivery = queued_delivery(f"https://8.8.8.8/hook?token={TOKEN}")
    viewer = staff("viewer", "view_webhookendpoint", "view_webhookdelivery")
    changer = staff(
        "changer", "view_webhookendpoint", "change_webhookendpoint", "view_webhookdelivery"
    )

    for listing in (ENDPOINTS, "/admin/webhooks/webhookdelivery/"):
        assert viewer.get(listing, {"q": TOKEN[:4]}).context["cl"].result_count == 0, listing
        assert changer.get(listing, {"q": TOKEN[:4]}).context["cl"].result_count == 1, listing
    assert (
        viewer.get("/admin/webhooks/webhookdelivery/", {"q": delivery.webhook_id})
        .context["cl"]
        .result_count
        == 1
    )
