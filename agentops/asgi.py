"""The ASGI entry point: HTTP through Django, websockets through Channels."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentops.settings")
# The web side's settings: a short wait for a database connection, so an outage answers 503 fast.
os.environ.setdefault("AGENTOPS_PROCESS_ROLE", "web")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from agentops.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Turn sockets authenticate with a token, not a cookie, so they take no origin check:
        # API clients (not browsers) often send no Origin header at all.
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
