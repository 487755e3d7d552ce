"""Running a call on the request's own event loop: the database work around it in a thread
that gives its connection back when done (so no request holds a pooled connection while it
waits on the provider). The call's HTTP is the loop's own session (``agentops.outbound``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.db import connection

T = TypeVar("T")


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
