"""The outbox: deliveries are written in the alert's transaction, sent after it commits, and
the cooldown holds when many processes raise the same key at once."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.db import close_old_connections, connection, transaction

from agentops.alerts import alert_raise
from agentops.models import Alert
from agentops.webhooks.models import WebhookDelivery
from tests.conftest import WorkerPool, wait_for
from tests.factories import WebhookEndpointFactory

from .conftest import Receiver, Reply

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_rolled_back_alert_leaves_no_delivery_and_sends_nothing(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    WebhookEndpointFactory.create(url=receiver.url)
    with pytest.raises(RuntimeError), transaction.atomic():
        alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
        raise RuntimeError("the caller's transaction fails")
    time.sleep(
        0.5
    )  # a chance for a delivery to be sent anyway (a committed one reaches the receiver well within that)
    assert not Alert.objects.exists() and not WebhookDelivery.objects.exists()
    assert receiver.received() == []
    # ...and the key's cooldown went with it: the next alert is delivered.
    alert_raise(kind="hard-down", agent="ada", model="m1", message="down again")
    wait_for(receiver.received, what="the next alert's delivery")


def test_the_delivery_is_sent_once_the_alerts_transaction_commits(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    WebhookEndpointFactory.create(url=receiver.url)
    with transaction.atomic():
        alert = alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
        time.sleep(
            0.5
        )  # the caller goes on in its transaction: a delivery sent before the commit would arrive meanwhile
        assert receiver.received() == []
    [request] = wait_for(receiver.received, what="the delivery after commit")
    assert f'"id":{alert.pk},' in request.body.decode()


def test_concurrent_alerts_of_one_key_queue_one_delivery(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    WebhookEndpointFactory.create(url=receiver.url)
    start = threading.Barrier(6)
    errors: list[BaseException] = []

    def raise_one(i: int) -> None:
        try:
            start.wait()
            with transaction.atomic():
                alert_raise(kind="hard-down", agent="ada", model="m1", message=f"down {i}")
                time.sleep(0.2)  # hold the transaction open: the others raise meanwhile
        except BaseException as exc:
            errors.append(exc)
        finally:
            close_old_connections()
            connection.close()

    threads = [threading.Thread(target=raise_one, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert Alert.objects.count() == 6
    assert WebhookDelivery.objects.count() == 1
    wait_for(receiver.received, what="the one delivery")
    time.sleep(0.5)  # a chance for a second delivery to arrive (the first came within that)
    assert len(receiver.received()) == 1


def test_each_endpoint_has_its_own_cooldown(settings: Any, webhook_workers: WorkerPool) -> None:
    from .conftest import Receiver as Made

    first, second = Made(), Made()
    try:
        WebhookEndpointFactory.create(url=first.url)
        alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
        WebhookEndpointFactory.create(url=second.url)  # added after the first alert
        alert_raise(kind="hard-down", agent="ada", model="m1", message="still down")
        wait_for(lambda: first.received() and second.received(), what="one delivery to each")
        time.sleep(0.3)  # a chance for a second delivery to either endpoint to arrive
        assert len(first.received()) == len(second.received()) == 1
    finally:
        first.close()
        second.close()


def test_a_delivery_task_sent_many_times_makes_one_request(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    from interfaces.tasks import webhook_deliver

    receiver.answer(Reply(200, delay_s=0.5))
    WebhookEndpointFactory.create(url=receiver.url)
    alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
    delivery = WebhookDelivery.objects.get()
    for _ in range(8):  # redeliveries, the sweep, a countdown: all at once
        webhook_deliver.delay(delivery.pk)
    wait_for(
        lambda: WebhookDelivery.objects.filter(pk=delivery.pk, status="delivered").exists(),
        what="the delivery",
    )
    time.sleep(1.0)  # a chance for the other seven tasks to send again (an answer takes 0.5 s)
    assert len(receiver.received()) == 1
    assert WebhookDelivery.objects.get(pk=delivery.pk).attempts == 1
