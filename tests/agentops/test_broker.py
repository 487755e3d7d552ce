"""The broker's transport (``agentops.broker``): the service's Celery app publishes through
kombu's Redis transport, whose channel keeps one client instead of building one per publish
and per acknowledgement."""

from __future__ import annotations

import uuid
from typing import Any

import redis
from django.conf import settings

from agentops.broker import Transport
from agentops.celery import app


def test_the_app_publishes_through_one_kept_client_and_the_message_arrives() -> None:
    queue = f"test-broker-{uuid.uuid4().hex}"
    with app.connection_for_write() as connection:
        assert isinstance(connection.transport, Transport)
        channel: Any = connection.default_channel  # kombu's Redis channel
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        app.amqp.Producer(channel).publish({"hello": "there"}, exchange="", routing_key=queue)
    raw = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        assert raw.llen(queue) == 1
    finally:
        raw.delete(queue)
