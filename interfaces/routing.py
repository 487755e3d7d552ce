from channels.auth import AuthMiddlewareStack
from django.urls import path

from interfaces.consumers import DashboardConsumer, TurnConsumer
from interfaces.origins import SameOriginValidator

websocket_urlpatterns = [
    path("ws/turns/<str:turn_id>", TurnConsumer.as_asgi()),
    # The dashboard signs in with the admin's session cookie, which a browser sends from any
    # page: only the site's own pages may open it (cross-site websocket hijacking).
    path("ws/dashboard", SameOriginValidator(AuthMiddlewareStack(DashboardConsumer.as_asgi()))),
]
