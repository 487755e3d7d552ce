"""The outbox: deliveries are written in the alert's transaction, sent after it commits, and
the cooldown holds when many processes raise the same key at once."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import close_old_connections, connection, transaction

from agentops.alerts import alert_raise
from agentops.models import Alert
from agentops.webhooks.models import WebhookDelivery
from tests.conftest import WorkerPool, wait_for
from tests.factories import WebhookEndpointFactory

from .conftest import Receiver, Reply, worker_had_its_chance

pytestmark = pytest.mark.django_db(transaction=True)


def elsewhere(work: Callable[[], None]) -> None:
    """Run ``work`` in a thread on a database connection of its own: what it writes commits
    whatever transaction the caller is in."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the work elsewhere did not end"
    if errors:
        raise errors[0]


def test_a_rolled_back_alert_leaves_no_delivery_and_sends_nothing(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    WebhookEndpointFactory.create(url=receiver.url, kinds=["hard-down"])
    with pytest.raises(RuntimeError), transaction.atomic():
        alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
        raise RuntimeError("the caller's transaction fails")
    assert not Alert.objects.exists() and not WebhookDelivery.objects.exists()
    assert receiver.received() == []
    # ...and the key's cooldown went with it: the next alert is delivered, and only it (a task
    # for the first, had one been sent, would have been queued before the probe's).
    alert_raise(kind="hard-down", agent="ada", model="m1", message="down again")
    wait_for(receiver.received, what="the next alert's delivery")
    worker_had_its_chance()
    assert [json.loads(r.body)["data"]["message"] for r in receiver.received()] == ["down again"]


def test_the_delivery_is_sent_once_the_alerts_transaction_commits(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    WebhookEndpointFactory.create(url=receiver.url, kinds=["hard-down"])
    with transaction.atomic():
        alert = alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
        # The caller goes on in its transaction while the worker sends an alert raised elsewhere:
        # a delivery sent before this commit would have arrived by then.
        elsewhere(worker_had_its_chance)
        assert receiver.received() == []
    [request] = wait_for(receiver.received, what="the delivery after commit")
    assert f'"id":{alert.pk},' in request.body.decode()


def test_concurrent_alerts_of_one_key_queue_one_delivery(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    WebhookEndpointFactory.create(url=receiver.url, kinds=["hard-down"])
    start = threading.Barrier(6)
    errors: list[BaseException] = []
    backends: list[int] = []  # each thread's database session
    done: list[int] = []

    def others_blocked_or_done() -> bool:
        """Whether the five other raisers wait on a lock (this one's cooldown row) or are done."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(DISTINCT pid) FROM pg_locks WHERE NOT granted AND pid = ANY(%s)",
                [backends],
            )
            row = cursor.fetchone()
        assert row is not None
        return bool(row[0] + len(done) >= 5)

    def raise_one(i: int) -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                row = cursor.fetchone()
                assert row is not None
                backends.append(row[0])
            start.wait()
            with transaction.atomic():
                alert_raise(kind="hard-down", agent="ada", model="m1", message=f"down {i}")
                # Held open until the others have raised and block on its cooldown row.
                wait_for(others_blocked_or_done, what="the other raisers to block")
            done.append(i)
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
    worker_had_its_chance()
    assert len(receiver.received()) == 1


def test_each_endpoint_has_its_own_cooldown(settings: Any, webhook_workers: WorkerPool) -> None:
    from .conftest import Receiver as Made

    first, second = Made(), Made()
    try:
        WebhookEndpointFactory.create(url=first.url, kinds=["hard-down"])
        alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
        WebhookEndpointFactory.create(url=second.url, kinds=["hard-down"])  # after the first alert
        alert_raise(kind="hard-down", agent="ada", model="m1", message="still down")
        wait_for(lambda: first.received() and second.received(), what="one delivery to each")
        worker_had_its_chance()
        assert len(first.received()) == len(second.received()) == 1
    finally:
        first.close()
        second.close()


def test_a_delivery_task_sent_many_times_makes_one_request(
    receiver: Receiver, webhook_workers: WorkerPool
) -> None:
    from interfaces.tasks import webhook_deliver

    receiver.answer(Reply(200, delay_s=0.5))
    WebhookEndpointFactory.create(url=receiver.url, kinds=["hard-down"])
    alert_raise(kind="hard-down", agent="ada", model="m1", message="down")
    delivery = WebhookDelivery.objects.get()
    for _ in range(8):  # redeliveries, the sweep, a countdown: all at once
        webhook_deliver.delay(delivery.pk)
    wait_for(
        lambda: WebhookDelivery.objects.filter(pk=delivery.pk, status="delivered").exists(),
        what="the delivery",
    )
    worker_had_its_chance()  # taken after the other seven tasks: they had their chance to send
    assert len(receiver.received()) == 1
    assert WebhookDelivery.objects.get(pk=delivery.pk).attempts == 1
