"""Running a call on the request's own event loop: its HTTP client, and the database work
around it in a thread that gives its connection back when done (so no request holds a pooled
connection while it waits on the provider)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from asgiref.sync import sync_to_async
from django.db import connection

from agentops.background import CONNECT_TIMEOUT_S

T = TypeVar("T")

_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def loop_http() -> httpx.AsyncClient:
    """The HTTP client of the running event loop (one per loop: a client is bound to it)."""
    loop = asyncio.get_running_loop()
    client = _clients.get(loop)
    if client is None:
        client = httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=100),
        )
        _clients[loop] = client
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
