from django.urls import path

from .consumers import TurnConsumer

websocket_urlpatterns = [
    path("ws/turns/<str:turn_id>", TurnConsumer.as_asgi()),
]
