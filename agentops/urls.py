from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import path

from agentops.api.routes import api, health_payload


def health(request: HttpRequest) -> JsonResponse:
    payload = health_payload()
    return JsonResponse(payload, status=200 if payload["status"] == "ok" else 503)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    path("health", health),
]
