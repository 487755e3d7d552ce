"""The web app answers the ASGI lifespan (architecture.md §3): the process's runtime is built and
started when the server starts, before any request, and stopped once when it shuts down; no
other code builds one. The server hands it to every request and socket in the scope's
``state``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from django.conf import settings
from django.test import RequestFactory

from interfaces.edge import RUNTIME_STATE_KEY, runtime_in, runtime_of
from turns.runtime import TurnRuntime

SCRIPT = textwrap.dedent(
    """
    import asyncio

    from interfaces.asgi import application
    from agentops import runtime
    from interfaces.edge import RUNTIME_STATE_KEY
    from turns.runtime import TurnRuntime

    async def main():
        inbox, sent = asyncio.Queue(), []

        async def send(message):
            sent.append(message["type"])

        assert runtime._installed is None
        state = {}  # what the server copies into every connection's scope
        served = asyncio.create_task(
            application({"type": "lifespan", "state": state}, inbox.get, send)
        )
        await inbox.put({"type": "lifespan.startup"})
        while not sent:
            await asyncio.sleep(0.01)
        made = runtime.installed()
        print("started", isinstance(made, TurnRuntime) and made.thread.is_alive())
        print("carried", state.get(RUNTIME_STATE_KEY) is made)
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait_for(served, 10)
        print("stopped", made._stopped, runtime._installed is None)
        print("sent", ",".join(sent))

    asyncio.run(main())
    """
)


def test_the_runtime_starts_with_the_server_and_stops_with_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:4] == [
        "started True",
        "carried True",
        "stopped True True",
        "sent lifespan.startup.complete,lifespan.shutdown.complete",
    ], done.stdout + done.stderr


def test_a_connection_is_handed_the_runtime_its_scope_carries(runtime: TurnRuntime) -> None:
    """A view or socket reads the runtime from its scope's state; where no lifespan ran (a
    test client, WSGI), from what the process installed."""
    other = TurnRuntime(worker=False)  # never started: only its identity is asked
    assert runtime_in({"state": {RUNTIME_STATE_KEY: other}}) is other
    other.loop.close()
    assert runtime_in({"type": "http"}) is runtime
    assert runtime_in(None) is runtime
    assert runtime_of(RequestFactory().get("/")) is runtime
