"""/metrics counts webhook delivery rounds by result, read from the attempt rows (only ever
added), so the counter never steps back; pending deliveries are a gauge."""

from __future__ import annotations

import pytest
from django.urls import path
from django.utils import timezone

from agentops.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from agentops.webhooks.services import webhook_delivery_resend
from interfaces.metrics import metrics_view
from tests.factories import AlertFactory, WebhookDeliveryFactory, WebhookEndpointFactory
from tests.interfaces.test_metrics import scrape, value

urlpatterns = [path("metrics", metrics_view)]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]

RESULTS = ("delivered", "failed", "gave_up")


def delivery(status: str, *outcomes: str) -> WebhookDelivery:
    """A delivery in ``status`` whose attempts ended with ``outcomes``, in order."""
    endpoint = WebhookEndpoint.objects.first() or WebhookEndpointFactory.create(
        url="https://8.8.8.8/hook"
    )
    alert = AlertFactory.create(kind="hard-down", agent="ada", message="down")
    made = WebhookDeliveryFactory.create(
        endpoint=endpoint, alert=alert, payload="{}", status=status, attempts=len(outcomes)
    )
    now = timezone.now()
    for number, outcome in enumerate(outcomes, start=1):
        WebhookAttempt.objects.create(
            delivery=made,
            number=number,
            started_at=now,
            ended_at=now if outcome else None,
            outcome=outcome,
        )
    return made


def results() -> dict[str, float]:
    scraped, _ = scrape()
    return {r: value(scraped, "agentops_webhook_deliveries_total", result=r) for r in RESULTS}


def test_the_delivery_counter_counts_ended_rounds_by_result_and_pending_is_a_gauge() -> None:
    _, types = scrape()
    assert (
        types["agentops_webhook_deliveries"] == "counter"
        and types["agentops_webhook_deliveries_pending"] == "gauge"
    )
    assert results() == dict.fromkeys(RESULTS, 0)

    for _ in range(3):
        delivery("delivered", "retry", "delivered")
    delivery("failed", "failed")
    delivery("failed", "refused")  # not sent: the URL was refused
    delivery("gave_up", "retry", "retry", "gave_up")
    for _ in range(4):
        delivery("pending", "retry", "")  # the second attempt under way
    after, _ = scrape()

    assert results() == {"delivered": 3, "failed": 2, "gave_up": 1}
    assert ("agentops_webhook_deliveries_total", (("result", "pending"),)) not in after
    assert ("agentops_webhook_deliveries_total", (("result", "retry"),)) not in after
    assert value(after, "agentops_webhook_deliveries_pending") == 4


def test_a_resend_does_not_take_the_counter_back_and_its_round_counts_again() -> None:
    failed = delivery("failed", "failed")
    assert results() == {"delivered": 0, "failed": 1, "gave_up": 0}

    webhook_delivery_resend(
        delivery_id=failed.pk, actor="admin:op", now=timezone.now()
    )  # pending again

    scraped, _ = scrape()
    assert results() == {"delivered": 0, "failed": 1, "gave_up": 0}
    assert value(scraped, "agentops_webhook_deliveries_pending") == 1
    # The resend's round ends: its attempt adds to its own result; the first round still counts.
    now = timezone.now()
    WebhookAttempt.objects.create(
        delivery=failed, number=2, started_at=now, ended_at=now, outcome="delivered"
    )
    WebhookDelivery.objects.filter(pk=failed.pk).update(status="delivered", attempts=2)
    assert results() == {"delivered": 1, "failed": 1, "gave_up": 0}
