"""Deliveries end to end: alert_raise → outbox row → real Celery worker → loopback receiver."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.db.models import F
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from agentops.alerts import alert_raise
from agentops.celery import app as celery_app
from agentops.webhooks.models import (
    WebhookAttempt,
    WebhookCooldown,
    WebhookDelivery,
    WebhookEndpoint,
)
from interfaces.tasks import webhooks_sweep
from tests.conftest import WorkerPool, wait_for
from tests.factories import AlertFactory, WebhookDeliveryFactory

from .conftest import Receiver, Reply, worker_had_its_chance

pytestmark = pytest.mark.django_db(transaction=True)


def endpoint(url: str, **fields: Any) -> WebhookEndpoint:
    made = WebhookEndpoint(url=url, **fields)
    made.full_clean()
    made.save()
    return made


def finished(delivery: WebhookDelivery) -> WebhookDelivery | None:
    delivery.refresh_from_db()
    return delivery if delivery.status != WebhookDelivery.Status.PENDING else None


def only_delivery(**filters: Any) -> WebhookDelivery:
    deliveries = list(WebhookDelivery.objects.filter(**filters))
    assert len(deliveries) == 1, deliveries
    return deliveries[0]


def test_a_receiver_gets_each_alert_once_per_cooldown_key(
    settings: Any, receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    settings.AGENTOPS_ALERT_WEBHOOK_COOLDOWN_MS = 1500
    endpoint(receiver.url)
    first = alert_raise(
        kind="history-kept", agent="ada", model="m1", verdict="refused", message="kept 1"
    )
    alert_raise(
        kind="history-kept", agent="ada", model="m1", verdict="refused", message="kept again"
    )  # same key
    other_verdict = alert_raise(
        kind="history-kept", agent="ada", model="m1", verdict="no-change", message="kept 2"
    )
    other_agent = alert_raise(
        kind="history-kept", agent="bob", model="m1", verdict="refused", message="kept 3"
    )
    wait_for(lambda: len(receiver.received()) >= 3, what="three deliveries")
    # Past the cooldown (1.5 s, set above): the keys' last deliveries moved back by more than it,
    # as though that long had passed.
    WebhookCooldown.objects.update(last_queued_at=F("last_queued_at") - timedelta(seconds=1.6))
    after_cooldown = alert_raise(
        kind="history-kept", agent="ada", model="m1", verdict="refused", message="kept 4"
    )
    wait_for(lambda: len(receiver.received()) >= 4, what="the delivery after the cooldown")
    wait_for(
        lambda: not WebhookDelivery.objects.filter(status=WebhookDelivery.Status.PENDING).exists(),
        what="deliveries to end",
    )

    sent = sorted(json.loads(r.body)["data"]["id"] for r in receiver.received())
    assert sent == sorted([first.pk, other_verdict.pk, other_agent.pk, after_cooldown.pk])
    assert len({r.headers["webhook-id"] for r in receiver.received()}) == 4
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {
        WebhookDelivery.Status.DELIVERED
    }


def test_an_endpoint_receives_only_its_kinds(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    endpoint(receiver.url, kinds=["hard-down"])
    alert_raise(kind="provider-wait", agent="ada", model="m1", message="held")
    down = alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
    wait_for(lambda: receiver.received(), what="a delivery")
    assert only_delivery().alert_id == down.pk


def test_the_signature_verifies_with_the_standardwebhooks_package(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    hook = endpoint(receiver.url)
    alert = alert_raise(kind="hard-down", agent="ada", model="m1", message="the model is down ✗")
    [request] = wait_for(receiver.received, what="the delivery")

    payload = Webhook(hook.secret).verify(request.body, request.headers)
    assert payload["type"] == "alert.raised"
    assert payload["data"]["id"] == alert.pk and payload["data"]["message"] == "the model is down ✗"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["webhook-id"].startswith("msg_")
    assert request.headers["webhook-id"] == only_delivery().webhook_id
    with pytest.raises(WebhookVerificationError):
        Webhook(hook.secret).verify(request.body.replace(b"ada", b"eve"), request.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB").verify(request.body, request.headers)


def test_a_500_then_200_receiver_gets_the_same_webhook_id_twice(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    receiver.answer(Reply(500, body=b"x" * 100_000), 200)
    hook = endpoint(receiver.url)
    alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
    delivery = wait_for(lambda: finished(only_delivery()), what="the delivery to end")

    assert delivery.status == WebhookDelivery.Status.DELIVERED and delivery.attempts == 2
    first, second = receiver.received()
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == delivery.webhook_id
    assert first.body == second.body
    for request in (first, second):
        Webhook(hook.secret).verify(request.body, request.headers)
    attempts = list(WebhookAttempt.objects.filter(delivery=delivery).order_by("number"))
    assert [(a.number, a.status_code, a.outcome) for a in attempts] == [
        (1, 500, "retry"),
        (2, 200, "delivered"),
    ]
    # The receiver's 100 kB error body is bounded before it is stored.
    assert (
        0 < len(attempts[0].response_excerpt) <= 1000
        and "characters omitted" in attempts[0].response_excerpt
    )
    assert all(a.ended_at is not None and a.duration_ms is not None for a in attempts)


def test_a_400_is_not_retried(receiver: Receiver, webhook_workers: WorkerPool) -> None:
    receiver.answer(Reply(400, body=b"bad payload"), 200)
    endpoint(receiver.url, kinds=["hard-down"])
    alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
    delivery = wait_for(lambda: finished(only_delivery()), what="the delivery to end")
    # A retry would be due within 150 ms (the retry base and its jitter); the probe's after 1 s.
    worker_had_its_chance(retried_after_s=1)

    assert delivery.status == WebhookDelivery.Status.FAILED
    assert len(receiver.received()) == 1
    assert WebhookAttempt.objects.filter(delivery=delivery).count() == 1
    assert "HTTP 400" in delivery.last_error and "bad payload" in delivery.last_error


def test_a_410_disables_the_endpoint_and_later_alerts_create_no_deliveries(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    receiver.answer(410)
    hook = endpoint(receiver.url)
    alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
    delivery = wait_for(lambda: finished(only_delivery()), what="the delivery to end")
    hook.refresh_from_db()

    assert delivery.status == WebhookDelivery.Status.FAILED
    assert not hook.enabled and hook.disabled_at is not None and "410" in hook.disabled_reason
    alert_raise(kind="turn-exhausted", agent="bob", model="m1", message="exhausted")
    assert WebhookDelivery.objects.filter(endpoint=hook).count() == 1
    assert len(receiver.received()) == 1


def test_a_429_with_retry_after_is_retried_after_at_least_that_long(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    receiver.answer(Reply(429, headers={"retry-after": "2"}), 200)
    endpoint(receiver.url)
    alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
    delivery = wait_for(lambda: finished(only_delivery()), what="the delivery to end")

    assert delivery.status == WebhookDelivery.Status.DELIVERED
    first, second = receiver.received()
    assert second.at - first.at >= 2.0


def test_a_receiver_that_keeps_failing_is_given_up_after_the_max_attempts(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    receiver.answer(503, 502, 500, 200)
    endpoint(receiver.url, kinds=["hard-down"])
    alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
    delivery = wait_for(lambda: finished(only_delivery()), what="the delivery to end")
    # A fourth attempt would be due within 600 ms (the third backoff and its jitter).
    worker_had_its_chance(retried_after_s=1)

    assert (
        delivery.status == WebhookDelivery.Status.GAVE_UP and delivery.attempts == 3
    )  # the worker's max
    assert len(receiver.received()) == 3
    first, second, third = (r.at for r in receiver.received())
    assert (
        second - first >= 0.1 and third - second >= 0.2
    )  # the backoff: 100 ms, then 200 ms (plus jitter)


def test_a_refused_connection_is_retried(receiver: Receiver, webhook_workers: WorkerPool) -> None:
    url = receiver.url
    receiver.close()  # nothing listens there now
    endpoint(url)
    alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
    delivery = wait_for(lambda: finished(only_delivery()), what="the delivery to end")
    assert delivery.status == WebhookDelivery.Status.GAVE_UP and delivery.attempts == 3
    assert "ClientConnectorError" in delivery.last_error


def test_the_sweep_sends_a_due_delivery_whose_task_was_lost(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    from django.utils import timezone

    from agentops.webhooks.services import alert_payload

    hook = endpoint(receiver.url, kinds=["hard-down"])
    alert = AlertFactory.create(kind="hard-down", agent="ada", message="down")
    # A delivery row as the outbox writes it, but no task was ever sent for it.
    lost = WebhookDeliveryFactory.create(
        endpoint=hook, alert=alert, payload=alert_payload(alert), next_attempt_at=timezone.now()
    )
    # Had a task been queued for it, the worker would have taken it before the probe's.
    worker_had_its_chance()
    assert receiver.received() == []
    webhooks_sweep.delay()
    delivery = wait_for(lambda: finished(lost), what="the swept delivery to end")
    assert delivery.status == WebhookDelivery.Status.DELIVERED
    assert [r.headers["webhook-id"] for r in receiver.received()] == [lost.webhook_id]


def test_a_delivery_to_a_loopback_url_sends_nothing_when_private_addresses_are_not_allowed(
    receiver: Receiver,
) -> None:
    from .conftest import WORKER_ENV

    endpoint(receiver.url)  # saved while allowed; the worker below does not allow it
    pool = WorkerPool(
        1, label="whpriv", extra_env={**WORKER_ENV, "AGENTOPS_WEBHOOKS_ALLOW_PRIVATE": "false"}
    )
    try:
        alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
        delivery = wait_for(lambda: finished(only_delivery()), what="the delivery to end")
        # No probe can show this worker had its chance (it sends nothing to loopback): once it
        # has no task left, a retry (a task with a countdown) would have been made.
        wait_for(pool.idle, what="the worker to run every task it was sent")
    finally:
        pool.stop()
        celery_app.conf.task_default_queue = pool.previous_queue

    assert delivery.status == WebhookDelivery.Status.FAILED
    assert "loopback" in delivery.last_error and "127.0.0.1" in delivery.last_error
    [attempt] = WebhookAttempt.objects.filter(delivery=delivery)
    assert attempt.outcome == WebhookAttempt.Outcome.REFUSED and attempt.status_code is None
    assert receiver.received() == []
