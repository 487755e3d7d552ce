"""The channel layer (``agentops.live.ChannelLayer``): a group send reaches every member, and
one to a group nobody is in costs one Redis command, not channels_redis's trim and read."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
from channels.layers import get_channel_layer
from django.conf import settings

from agentops.live import ChannelLayer


def _zrange_calls() -> int:
    """ZRANGE calls the suite's Redis has served: channels_redis reads a group's members with it."""
    stats = redis.Redis.from_url(settings.REDIS_URL).info("commandstats")
    return int(stats.get("cmdstat_zrange", {}).get("calls", 0))


async def test_a_group_send_reaches_its_members_and_asks_one_question_of_an_empty_group() -> None:
    layer = get_channel_layer()
    assert isinstance(layer, ChannelLayer)
    group = f"test-{uuid.uuid4().hex}"
    before = _zrange_calls()
    for _ in range(200):
        await layer.group_send(group, {"type": "turn.event", "event": {"type": "call.delta", "text": "x"}})
    # The stock layer makes 200 (and 200 trims); anything else the suite's Redis serves
    # meanwhile only adds.
    assert _zrange_calls() - before < 100

    first, second = await layer.new_channel(), await layer.new_channel()
    await layer.group_add(group, first)
    await layer.group_add(group, second)
    try:
        await layer.group_send(group, {"type": "turn.event", "event": {"type": "call.delta", "text": "hello"}})
        for channel in (first, second):
            message = await asyncio.wait_for(layer.receive(channel), timeout=10)
            assert message["event"] == {"type": "call.delta", "text": "hello"}
    finally:
        await layer.group_discard(group, first)
        await layer.group_discard(group, second)
    # The last member left: the group is empty again, and its send reaches nobody.
    await layer.group_send(group, {"type": "turn.event", "event": {"type": "call.delta", "text": "late"}})
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(layer.receive(first), timeout=0.5)
