"""The cooldown counts from when a key's delivery was *queued*, whatever became of it
(docs/operations.md, Webhooks): a receiver that is down while its first delivery retries gets
no second delivery of the same key, and alerts left out do not extend the cooldown. Edges at
cooldown - 1 ms and at the cooldown, with an explicit ``now``."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from agentops.webhooks.models import WebhookDelivery
from agentops.webhooks.services import webhook_deliveries_queue
from tests.factories import AlertFactory, WebhookEndpointFactory

pytestmark = pytest.mark.django_db

COOLDOWN_MS = 60_000


def raised(at: datetime, **key: Any) -> list[int]:
    alert = AlertFactory.create(
        kind="hard-down",
        agent=key.get("agent", "ada"),
        model="m1",
        verdict=key.get("verdict", ""),
        message="down",
    )
    return webhook_deliveries_queue(alert=alert, now=at)


def test_a_key_queued_within_the_cooldown_is_not_queued_again_even_while_its_delivery_is_still_pending(
    settings: Any,
) -> None:
    settings.AGENTOPS_ALERT_WEBHOOK_COOLDOWN_MS = COOLDOWN_MS
    WebhookEndpointFactory.create(url="https://8.8.8.8/hook")
    t0 = timezone.now()

    [first] = raised(t0)
    WebhookDelivery.objects.filter(pk=first).update(
        attempts=3, last_error="HTTP 503; retrying"
    )  # still retrying
    assert raised(t0 + timedelta(milliseconds=COOLDOWN_MS - 1)) == []
    assert (
        len(raised(t0 + timedelta(milliseconds=COOLDOWN_MS - 1), agent="bob")) == 1
    )  # another key
    # The alert left out at cooldown - 1 ms did not restart the cooldown: at the cooldown, it
    # queues.
    assert len(raised(t0 + timedelta(milliseconds=COOLDOWN_MS))) == 1
    assert WebhookDelivery.objects.filter(alert__agent="ada").count() == 2
