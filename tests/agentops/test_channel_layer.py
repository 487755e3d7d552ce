"""The channel layer (``agentops.live.ChannelLayer``): a group send reaches every member, and
one to a group nobody is in costs one Redis command, not channels_redis's trim and read."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from channels.layers import get_channel_layer
from channels_redis.core import RedisChannelLayer

from agentops.live import ChannelLayer


async def test_a_group_send_reaches_its_members_and_asks_one_question_of_an_empty_group(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer = get_channel_layer()
    assert isinstance(layer, ChannelLayer)
    stock_sends: list[str] = []  # channels_redis's own send: the trim, the read and the send
    stock = RedisChannelLayer.group_send

    async def counted(self: RedisChannelLayer, group: str, message: dict[str, Any]) -> None:
        stock_sends.append(group)
        await stock(self, group, message)

    monkeypatch.setattr(RedisChannelLayer, "group_send", counted)
    group = f"test-{uuid.uuid4().hex}"
    for _ in range(200):
        await layer.group_send(
            group, {"type": "turn.event", "event": {"type": "call.delta", "text": "x"}}
        )
    assert stock_sends == []

    first, second = await layer.new_channel(), await layer.new_channel()
    await layer.group_add(group, first)
    await layer.group_add(group, second)
    try:
        await layer.group_send(
            group, {"type": "turn.event", "event": {"type": "call.delta", "text": "hello"}}
        )
        assert stock_sends == [group]
        for channel in (first, second):
            message = await asyncio.wait_for(layer.receive(channel), timeout=10)
            assert message["event"] == {"type": "call.delta", "text": "hello"}
    finally:
        await layer.group_discard(group, first)
        await layer.group_discard(group, second)
    # The last member left: the group is empty again, and its send reaches nobody.
    await layer.group_send(
        group, {"type": "turn.event", "event": {"type": "call.delta", "text": "late"}}
    )
    assert stock_sends == [group]
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(layer.receive(first), timeout=0.5)


async def test_a_batch_asks_about_all_its_groups_in_one_round_trip_and_reaches_the_members_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layer = get_channel_layer()
    assert isinstance(layer, ChannelLayer)
    stock_sends: list[str] = []
    stock = RedisChannelLayer.group_send

    async def counted(self: RedisChannelLayer, group: str, message: dict[str, Any]) -> None:
        stock_sends.append(group)
        await stock(self, group, message)

    monkeypatch.setattr(RedisChannelLayer, "group_send", counted)
    commands: list[
        str
    ] = []  # every command the layer's Redis connection is sent, one at a time or pipelined
    connection = layer.connection(0)
    single, pipelined = type(connection).execute_command, type(connection.pipeline()).execute

    async def one(self: Any, *args: Any, **kwargs: Any) -> Any:
        commands.append(str(args[0]))
        return await single(self, *args, **kwargs)

    async def pipe(self: Any, *args: Any, **kwargs: Any) -> Any:
        commands.append(f"pipeline of {len(self.command_stack)}")
        return await pipelined(self, *args, **kwargs)

    monkeypatch.setattr(type(connection), "execute_command", one)
    monkeypatch.setattr(type(connection.pipeline()), "execute", pipe)
    heard = f"test-{uuid.uuid4().hex}"
    empty = [f"test-{uuid.uuid4().hex}" for _ in range(50)]
    member = await layer.new_channel()
    await layer.group_add(heard, member)
    try:
        commands.clear()
        sends = [
            (group, {"type": "turn.event", "event": {"type": "call.delta", "text": group}})
            for group in empty
        ]
        sends[10:10] = [
            (heard, {"type": "turn.event", "event": {"type": "call.delta", "text": "first"}})
        ]
        sends.append(
            (heard, {"type": "turn.event", "event": {"type": "call.delta", "text": "second"}})
        )
        await layer.group_send_many(sends)
        assert commands[0] == "pipeline of 51"  # one question for all 51 groups, and no other
        assert "ZCARD" not in commands
        assert stock_sends == [heard, heard]  # nobody is in the other 50: nothing sent to them
        for text in ("first", "second"):
            message = await asyncio.wait_for(layer.receive(member), timeout=10)
            assert message["event"]["text"] == text
    finally:
        await layer.group_discard(heard, member)
