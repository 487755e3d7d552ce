"""The service's edge: what answers outside the routes themselves.

* Under ``/api/``, an unknown route (404) or a method the route does not take (405) answers
  API.md's error shape, ``{"code", "message", "data"}``, not Django's HTML or plain text.
* ``/`` sends staff to the dashboard and everyone else to the API's interactive docs.
* ``/favicon.ico``: a small icon, so browsers stop logging 404s.
* Sync views (a submit, the admin) hold a database connection while they run: at most as many
  run at once as the connection pool holds, and the others wait their turn here. Otherwise a
  burst larger than the pool waits for connections, past the pool's short timeout in the web
  process (there so that an outage answers 503 fast), and gets 503s although the database
  answers. Async views (``complete``, the drop-in endpoints) hold no connection while they
  wait on the provider and are not counted.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.http.response import HttpResponseBase
from django.urls import Resolver404, resolve, reverse
from django.utils.decorators import sync_and_async_middleware

API_PREFIX = "/api/"

FAVICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
    '<rect width="32" height="32" rx="6" fill="#264b5d"/>'
    '<path d="M6 22 L12 12 L17 18 L21 9 L26 22" fill="none" stroke="#f5dd5d" stroke-width="3" '
    'stroke-linecap="round" stroke-linejoin="round"/></svg>'
)


@sync_and_async_middleware
def api_edge_middleware(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Turn the 404s and 405s Django and ninja produce under ``/api/`` into JSON errors. Async
    capable: a sync-only middleware would run every async view (``complete``, the drop-in
    endpoints) in a thread on a loop of its own, which ends with the view."""
    if iscoroutinefunction(get_response):

        async def edge_async(request: HttpRequest) -> HttpResponseBase:
            if _holds_a_connection(request):
                async with _sync_view_gate():
                    return api_error_shaped(request, await get_response(request))
            return api_error_shaped(request, await get_response(request))

        return edge_async

    def edge(request: HttpRequest) -> HttpResponseBase:
        return api_error_shaped(request, get_response(request))

    return edge


_gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def _sync_view_gate() -> asyncio.Semaphore:
    """The running loop's gate (one per loop: a semaphore is bound to it)."""
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        # Two connections left over for the async views' short database work.
        gate = _gates[loop] = asyncio.Semaphore(max(1, settings.DATABASES["default"]["OPTIONS"]["pool"]["max_size"] - 2))
    return gate


def _holds_a_connection(request: HttpRequest) -> bool:
    """Whether the request's view is sync (it holds a database connection while it runs)."""
    try:
        view = resolve(request.path_info).func
    except Resolver404:
        return False
    return not iscoroutinefunction(view)


def api_error_shaped(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    if not request.path.startswith(API_PREFIX) or response.status_code not in (404, 405):
        return response
    if response.get("Content-Type", "").startswith("application/json"):
        return response  # already the API's own error
    if response.status_code == 404:
        body = {"code": "not_found", "message": f"no API route {request.path}", "data": {"path": request.path}}
        return JsonResponse(body, status=404)
    allowed = [m.strip() for m in response.get("Allow", "").split(",") if m.strip()]
    body = {
        "code": "method_not_allowed",
        "message": f"{request.method} is not allowed on {request.path}" + (f"; allowed: {', '.join(allowed)}" if allowed else ""),
        "data": {"method": request.method, "allowed": allowed},
    }
    out = HttpResponse(json.dumps(body), status=405, content_type="application/json")
    if allowed:
        out["Allow"] = ", ".join(allowed)
    return out


def root_view(request: HttpRequest) -> HttpResponse:
    """``/``: the dashboard for staff, the API docs for everyone else."""
    if request.user.is_authenticated and request.user.is_staff:
        return HttpResponseRedirect(reverse("dashboard"))
    return HttpResponseRedirect("/api/v1/docs")


def favicon_view(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(FAVICON, content_type="image/svg+xml")
    response["Cache-Control"] = "public, max-age=86400"
    return response
