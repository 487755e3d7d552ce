"""The admin: deliveries are read-only records with their attempts inline; Resend needs its own
permission, keeps the webhook-id, and is audited."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client

from agentops.alerts import alert_raise
from agentops.models import AuditEntry
from agentops.webhooks.models import WebhookDelivery
from tests.conftest import WorkerPool, wait_for
from tests.factories import WebhookEndpointFactory

from .conftest import Receiver, Reply

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "/admin/webhooks/webhookdelivery/"
RESEND = b"Resend the selected deliveries"


def staff(name: str, *perms: str) -> Client:
    user = User.objects.create_user(name, password="x", is_staff=True)
    user.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_webhookdelivery", *perms])
    )
    client = Client()
    client.force_login(user)
    return client


def test_resend_needs_the_permission_keeps_the_webhook_id_and_is_audited(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    receiver.answer(Reply(400, body=b"schema mismatch"), 200)
    WebhookEndpointFactory.create(url=receiver.url)
    alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
    delivery = WebhookDelivery.objects.get()
    wait_for(
        lambda: WebhookDelivery.objects.filter(pk=delivery.pk, status="failed").exists(),
        what="the 400 to fail the delivery",
    )

    without = staff("op-plain")
    page = without.get(CHANGELIST)
    assert (
        page.status_code == 200
        and delivery.webhook_id.encode() in page.content
        and RESEND not in page.content
    )
    without.post(CHANGELIST, {"action": "resend", "_selected_action": [delivery.pk]})
    detail = without.get(f"{CHANGELIST}{delivery.pk}/change/")
    assert detail.status_code == 200
    inline = detail.context["inline_admin_formsets"]
    assert [[f.original.response_excerpt for f in formset] for formset in inline] == [
        ["schema mismatch"]
    ]  # the attempt, inline
    assert WebhookDelivery.objects.get(pk=delivery.pk).status == "failed"
    assert not AuditEntry.objects.filter(action="webhook.resend").exists()

    allowed = staff("op-resend", "resend_webhookdelivery")
    assert RESEND in allowed.get(CHANGELIST).content
    allowed.post(CHANGELIST, {"action": "resend", "_selected_action": [delivery.pk]})
    wait_for(
        lambda: WebhookDelivery.objects.filter(pk=delivery.pk, status="delivered").exists(),
        what="the resend to deliver",
    )

    first, second = receiver.received()
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == delivery.webhook_id
    assert WebhookDelivery.objects.get(pk=delivery.pk).attempts == 2
    [entry] = AuditEntry.objects.filter(action="webhook.resend")
    assert entry.actor == "admin:op-resend" and entry.target == f"webhook-delivery:{delivery.pk}"
    assert (
        entry.data["webhook_id"] == delivery.webhook_id
        and entry.data["previous_status"] == "failed"
    )


def test_resending_to_a_disabled_endpoint_is_refused_with_a_message(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    receiver.answer(410)
    WebhookEndpointFactory.create(url=receiver.url)
    alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
    wait_for(lambda: WebhookDelivery.objects.filter(status="failed").exists(), what="the 410")
    delivery = WebhookDelivery.objects.get()

    allowed = staff("op-resend", "resend_webhookdelivery")
    response = allowed.post(
        CHANGELIST, {"action": "resend", "_selected_action": [delivery.pk]}, follow=True
    )
    assert b"is disabled" in response.content and b"enable it before resending" in response.content
    assert WebhookDelivery.objects.get(pk=delivery.pk).status == "failed"
    assert not AuditEntry.objects.filter(action="webhook.resend").exists()
    assert len(receiver.received()) == 1
