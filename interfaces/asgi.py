"""The ASGI entry point: HTTP through Django, websockets through Channels."""

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

from agentops.telemetry import telemetry_setup  # noqa: E402
from interfaces.edge import KeptThreadsASGIHandler  # noqa: E402
from interfaces.routing import websocket_urlpatterns  # noqa: E402
from interfaces.static_files import static_files  # noqa: E402
from interfaces.tracing_asgi import traced_http  # noqa: E402

django_asgi_app = KeptThreadsASGIHandler()
static_app = static_files()


async def http_app(scope: dict, receive: Any, send: Any) -> None:
    """Static files (the admin's and the dashboard's) by WhiteNoise; everything else by Django."""
    if scope["path"].startswith(settings.STATIC_URL):
        await static_app(scope, receive, send)
    else:
        await django_asgi_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        # With telemetry exported, each request is a server span continuing the client's
        # traceparent (interfaces.tracing_asgi).
        "http": traced_http(http_app) if telemetry_setup(role="web") else http_app,
        # Turn sockets authenticate with a token, not a cookie, so they take no origin check:
        # API clients (not browsers) often send no Origin header at all.
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
