"""The web app answers the ASGI lifespan (architecture.md §3): the process's runtime is built and
started when the server starts, before any request, and stopped once when it shuts down; no
other code builds one."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from django.conf import settings

SCRIPT = textwrap.dedent(
    """
    import asyncio

    from interfaces.asgi import application
    from agentops import runtime
    from turns.runtime import TurnRuntime

    async def main():
        inbox, sent = asyncio.Queue(), []

        async def send(message):
            sent.append(message["type"])

        assert runtime._installed is None
        served = asyncio.create_task(application({"type": "lifespan"}, inbox.get, send))
        await inbox.put({"type": "lifespan.startup"})
        while not sent:
            await asyncio.sleep(0.01)
        made = runtime.installed()
        print("started", isinstance(made, TurnRuntime) and made.thread.is_alive())
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
    assert done.stdout.split("\n")[:3] == [
        "started True",
        "stopped True True",
        "sent lifespan.startup.complete,lifespan.shutdown.complete",
    ], done.stdout + done.stderr
