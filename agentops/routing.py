from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from .consumers import DashboardConsumer, TurnConsumer

websocket_urlpatterns = [
    path("ws/turns/<str:turn_id>", TurnConsumer.as_asgi()),
    # The dashboard signs in with the admin's session cookie, which a browser sends from any
    # page: only pages served from our own hosts may open it (cross-site websocket hijacking).
    path("ws/dashboard", AllowedHostsOriginValidator(AuthMiddlewareStack(DashboardConsumer.as_asgi()))),
]
