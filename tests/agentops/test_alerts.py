"""The alert service (architecture.md §8): what one ``alert_raise`` writes and sends, and that its
data is bounded once for every consumer: the row, the failures.log line, the dashboard event and the
webhook body."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer

from agentops.alerts import alert_raise
from agentops.live import DASHBOARD_GROUP
from agentops.models import Alert
from agentops.selectors import alert_json
from agentops.text import DATA_ITEMS_LIMIT, FAILURE_TEXT_LIMIT
from agentops.webhooks.models import WebhookDelivery
from agentops.webhooks.services import alert_payload
from tests.factories import WebhookEndpointFactory

pytestmark = [pytest.mark.django_db(transaction=True)]

HUGE = "x" * 1_000_000


@pytest.fixture
def failures_log(settings: Any, tmp_path: Path) -> Path:
    path = tmp_path / "failures.log"
    settings.AGENTOPS_FAILURES_LOG = str(path)
    return path


def log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def test_an_alerts_data_is_bounded_alike_in_its_row_its_log_line_its_dashboard_event_and_its_webhook_body(
    failures_log: Path,
) -> None:
    # Nobody listens at this address: the delivery row is what is checked, not a request.
    await database_sync_to_async(WebhookEndpointFactory.create)(url="http://127.0.0.1:9/hook")
    layer = get_channel_layer()
    assert layer is not None
    channel = await layer.new_channel()
    await layer.group_add(DASHBOARD_GROUP, channel)
    try:
        alert = await database_sync_to_async(alert_raise)(
            kind="turn-exhausted",
            agent="ada",
            model="m1",
            message="ran out",
            data={"error": {"message": HUGE}, "calls": list(range(1000))},
        )
        event = await asyncio.wait_for(layer.receive(channel), timeout=10)
    finally:
        await layer.group_discard(DASHBOARD_GROUP, channel)

    row = await database_sync_to_async(Alert.objects.get)(pk=alert.pk)
    stored = row.data
    assert (
        len(stored["error"]["message"]) == FAILURE_TEXT_LIMIT
        and "omitted]" in stored["error"]["message"]
    )
    assert stored["calls"] == list(range(DATA_ITEMS_LIMIT))

    assert event["type"] == "dashboard.event" and event["event"]["type"] == "alert.raised"
    assert event["event"]["alert"] == alert_json(row)  # the same bounded data, the one JSON shape

    delivery = await database_sync_to_async(WebhookDelivery.objects.get)(alert_id=alert.pk)
    assert json.loads(delivery.payload)["data"]["data"] == stored
    assert len(delivery.payload) < 5_000

    [line] = log_lines(failures_log)
    assert line["kind"] == "turn-exhausted" and line["alert"] == alert.pk and line["data"] == stored


def test_the_webhook_body_is_the_dashboards_alert_json_without_its_acknowledgement(
    failures_log: Path,
) -> None:
    alert = alert_raise(
        kind="hard-down", agent="ada", model="m1", verdict="history", message="down", data={"n": 1}
    )
    body = json.loads(alert_payload(alert))
    shown = alert_json(alert)
    assert shown.pop("acknowledged_at") is None
    assert body == {"type": "alert.raised", "timestamp": shown["created_at"], "data": shown}
