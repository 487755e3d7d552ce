"""/metrics counts webhook deliveries by result, read from the rows."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import path

from agentops.metrics import metrics_view
from agentops.models import Alert
from tests.agentops.test_metrics import scrape, value
from webhooks.models import WebhookDelivery, WebhookEndpoint

urlpatterns = [path("metrics", metrics_view)]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


def deliveries(status: str, n: int) -> None:
    endpoint = WebhookEndpoint.objects.first() or WebhookEndpoint.objects.create(url="https://8.8.8.8/hook")
    alert = Alert.objects.create(kind="hard-down", agent="ada", message="down")
    for _ in range(n):
        WebhookDelivery.objects.create(endpoint=endpoint, alert=alert, payload="{}", status=status)


def test_the_delivery_counter_moves_by_result_and_pending_is_a_gauge(settings: Any) -> None:
    before, types = scrape()
    assert types["agentops_webhook_deliveries"] == "counter" and types["agentops_webhook_deliveries_pending"] == "gauge"
    assert {value(before, "agentops_webhook_deliveries_total", result=r) for r in ("delivered", "failed", "gave_up")} == {0}

    deliveries("delivered", 3)
    deliveries("failed", 2)
    deliveries("gave_up", 1)
    deliveries("pending", 4)
    after, _ = scrape()
    assert value(after, "agentops_webhook_deliveries_total", result="delivered") == 3
    assert value(after, "agentops_webhook_deliveries_total", result="failed") == 2
    assert value(after, "agentops_webhook_deliveries_total", result="gave_up") == 1
    assert ("agentops_webhook_deliveries_total", (("result", "pending"),)) not in after
    assert value(after, "agentops_webhook_deliveries_pending") == 4
