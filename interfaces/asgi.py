"""The ASGI entry point: HTTP through Django (liveness and static files before it), websockets
through Channels."""

import asyncio
import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")
# The web side's settings: a short wait for a database connection, so an outage answers 503
# fast. Read once, as the settings load; not left in the environment for child processes.
_role_set = "AGENTOPS_PROCESS_ROLE" not in os.environ
if _role_set:
    os.environ["AGENTOPS_PROCESS_ROLE"] = "web"
try:
    django.setup(set_prefix=False)  # as get_asgi_application() does
finally:
    if _role_set:
        del os.environ["AGENTOPS_PROCESS_ROLE"]

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from agentops.runtime import EXIT_FLUSH_S, install  # noqa: E402
from agentops.telemetry import telemetry_setup  # noqa: E402
from interfaces.edge import RUNTIME_STATE_KEY, KeptThreadsASGIHandler  # noqa: E402
from interfaces.routing import websocket_urlpatterns  # noqa: E402
from interfaces.static_files import static_files  # noqa: E402
from interfaces.tracing_asgi import traced_http  # noqa: E402
from turns.runtime import TurnRuntime  # noqa: E402

django_asgi_app = KeptThreadsASGIHandler()
static_app = static_files()


LIVE_PATH = "/health/live"
LIVE_BODY = b'{"status": "ok"}'


async def live(scope: dict, send: Any) -> None:
    """Liveness answered on the loop, before Django: no thread hop and no middleware, so a
    process whose threads are all busy (a flood of stream events) still answers within its
    probe's timeout. Its meaning is the Django view's (``interfaces.urls.health_live``): the
    process answers; nothing else is asked."""
    if scope["method"] in ("GET", "HEAD"):
        status, body = 200, LIVE_BODY
        headers = [(b"content-type", b"application/json")]
    else:
        status, body = 405, b""
        headers = [(b"allow", b"GET, HEAD")]
    headers += [(b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def http_app(scope: dict, receive: Any, send: Any) -> None:
    """Liveness on the loop; static files (the admin's and the dashboard's) from WhiteNoise's
    index; everything else by Django."""
    if scope["path"] == LIVE_PATH:
        await live(scope, send)
    elif scope["path"].startswith(settings.STATIC_URL):
        await static_app(scope, receive, send)
    else:
        await django_asgi_app(scope, receive, send)


async def lifespan(scope: dict, receive: Any, send: Any) -> None:
    """The server's lifespan: the process's runtime built and started at startup (its loop,
    threads and parts ready before the first request), and stopped at shutdown after the
    server's connections closed (its outbox sent, its provider connections closed). The
    runtime goes in the lifespan's ``state``, which the server hands every request and socket
    in its scope (``interfaces.edge.runtime_in``)."""
    made: TurnRuntime | None = None
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            made = TurnRuntime(worker=False)
            await asyncio.to_thread(made.start)
            install(made)  # for what no connection hands it: live events, commands' code
            if "state" in scope:
                scope["state"][RUNTIME_STATE_KEY] = made
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if made is not None:
                await asyncio.to_thread(made.stop, EXIT_FLUSH_S)
                install(None)
            await send({"type": "lifespan.shutdown.complete"})
            return


application = ProtocolTypeRouter(
    {
        # With telemetry exported, each request is a server span continuing the client's
        # traceparent (interfaces.tracing_asgi).
        "http": traced_http(http_app) if telemetry_setup(role="web") else http_app,
        # Turn sockets authenticate with a token, not a cookie, so they take no origin check:
        # API clients (not browsers) often send no Origin header at all.
        "websocket": URLRouter(websocket_urlpatterns),
        "lifespan": lifespan,
    }
)
