"""Running a call on the request's own event loop: its HTTP client, and the database work
around it in a thread that gives its connection back when done (so no request holds a pooled
connection while it waits on the provider)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection

from agentops import http1
from agentops.background import CONNECT_TIMEOUT_S, KEPT_CONNECTIONS

T = TypeVar("T")

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, http1.Client] = weakref.WeakKeyDictionary()


def loop_http() -> http1.Client:
    """The HTTP client of the running event loop (one per loop: its connections are bound to it)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = _clients[loop] = http1.Client(connect_timeout_s=CONNECT_TIMEOUT_S, keep_idle=KEPT_CONNECTIONS)
    return client


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn`` off the event loop, its database connection given back when it returns. In any
    thread of the loop's executor, not the request's own: nothing carries over from one call
    to the next, and a call's work may go on after its request ended (a drop-in stream whose
    client went away is recorded as aborted then), when the request's thread is no longer its."""

    def run() -> T:
        try:
            return fn(*args, **kwargs)
        finally:
            if not connection.in_atomic_block:
                connection.close()

    return await sync_to_async(run, thread_sensitive=False)()
