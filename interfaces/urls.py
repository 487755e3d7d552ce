from django.contrib import admin
from django.http import HttpRequest, JsonResponse
from django.urls import path, re_path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

from interfaces.api.routes import api, health_payload
from interfaces.dropin import idempotent
from interfaces.dropin import views as dropin
from interfaces.edge import favicon_view, root_view
from interfaces.metrics import metrics_view
from interfaces.views import dashboard_view


@csrf_exempt  # no cookie is read: a POST is answered 405 by the method check, not 403
@require_safe
def health(request: HttpRequest) -> JsonResponse:
    """Readiness (``/health/ready``, and ``/health`` as ever): the database, Redis and the
    waits journal answer. 503 while any does not."""
    payload = health_payload()
    return JsonResponse(payload, status=200 if payload["status"] == "ok" else 503)


@csrf_exempt
@require_safe
def health_live(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers. Nothing else is asked, so an outage of the database or
    Redis does not get a healthy process restarted."""
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("", root_view, name="root"),
    path("favicon.ico", favicon_view),
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
    # The drop-in endpoints (architecture.md §14): where an official SDK's base URL points.
    path("v1/chat/completions", idempotent.chat_completions),
    path("v1/messages", idempotent.messages),
    path("v1/responses", idempotent.responses),
    path("v1/models", dropin.models),
    path("v1/models/<path:model_id>", dropin.models),
    re_path(r"^v1/", dropin.unknown),
    path("health", health),
    path("health/ready", health),
    path("health/live", health_live),
    path("metrics", metrics_view),
    path("dashboard/", dashboard_view, name="dashboard"),
]
