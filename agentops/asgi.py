"""The ASGI entry point: HTTP through Django, websockets through Channels."""

import os

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

from agentops.edge import KeptThreadsASGIHandler  # noqa: E402
from agentops.routing import websocket_urlpatterns  # noqa: E402
from agentops.telemetry import telemetry_setup  # noqa: E402
from agentops.tracing_asgi import traced_http  # noqa: E402

django_asgi_app = KeptThreadsASGIHandler()

application = ProtocolTypeRouter(
    {
        # With telemetry exported, each request is a server span continuing the client's
        # traceparent (agentops.tracing_asgi); otherwise Django's handler alone.
        "http": traced_http(django_asgi_app) if telemetry_setup(role="web") else django_asgi_app,
        # Turn sockets authenticate with a token, not a cookie, so they take no origin check:
        # API clients (not browsers) often send no Origin header at all.
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
