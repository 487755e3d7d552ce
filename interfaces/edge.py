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
* Django's stock middleware, without a thread hop per step (below).
* Django's ASGI handler, whose requests reuse threads kept from the requests before them
  (``KeptThreadsASGIHandler``) instead of starting two threads each.
* The runtime a request or socket carries (``runtime_of``, ``runtime_in``): the one the ASGI
  lifespan built, handed to every connection in its scope's ``state``.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any, Final

from asgiref.sync import ThreadSensitiveContext, iscoroutinefunction, sync_to_async
from django.conf import settings
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.exceptions import ImproperlyConfigured
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.http.response import HttpResponseBase
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.common import CommonMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware
from django.urls import Resolver404, resolve, reverse
from django.utils.decorators import sync_and_async_middleware

from turns.runtime import TurnRuntime, running

API_PREFIX = "/api/"
# Where clients authenticate with a token and the views read no session or user: the API (its
# docs page too) and the drop-in endpoints.
TOKEN_PREFIXES = (API_PREFIX, "/v1/")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS", "TRACE")

FAVICON = (
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">'
    '<rect width="32" height="32" rx="6" fill="#264b5d"/>'
    '<path d="M6 22 L12 12 L17 18 L21 9 L26 22" fill="none" stroke="#f5dd5d" stroke-width="3" '
    'stroke-linecap="round" stroke-linejoin="round"/></svg>'
)


# The key of the lifespan's state under which the web's runtime is handed to each connection.
RUNTIME_STATE_KEY = "agentops.runtime"


def runtime_in(scope: Mapping[str, Any] | None) -> TurnRuntime:
    """The runtime a connection's scope carries: the ASGI lifespan (``interfaces.asgi``) puts
    the web's runtime in its ``state``, which the server copies into every request's and
    socket's scope. Where no lifespan ran (Django's test clients, a socket's test
    communicator) the connection carries none, and the runtime the process installed is the
    one: the only place a request or socket looks the runtime up."""
    carried = (scope or {}).get("state", {}).get(RUNTIME_STATE_KEY)
    if isinstance(carried, TurnRuntime):
        return carried
    return running()


def runtime_of(request: HttpRequest) -> TurnRuntime:
    """The runtime ``request`` carries (``runtime_in``): a view is handed it by its request."""
    return runtime_in(getattr(request, "scope", None))


@sync_and_async_middleware
def api_edge_middleware(get_response: Callable[[HttpRequest], Any]) -> Callable[[HttpRequest], Any]:
    """Turn the 404s and 405s Django and ninja produce under ``/api/`` into JSON errors. Async
    capable: a sync-only middleware would run every async view (``complete``, the drop-in
    endpoints) in a thread on a loop of its own, which ends with the view."""
    if iscoroutinefunction(get_response):
        # The sync views' gates, one per loop (a semaphore is bound to it): the web serves on
        # uvicorn's one loop; Django's test clients run each request on a loop of its own.
        gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

        async def edge_async(request: HttpRequest) -> HttpResponseBase:
            if _holds_a_connection(request) and (gate := _sync_view_gate(gates)) is not None:
                async with gate:
                    return api_error_shaped(request, await get_response(request))
            return api_error_shaped(request, await get_response(request))

        return edge_async

    def edge(request: HttpRequest) -> HttpResponseBase:
        return api_error_shaped(request, get_response(request))

    return edge


def _sync_view_gate(
    gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore],
) -> asyncio.Semaphore | None:
    """The running loop's gate among ``gates``; none without a connection pool (the test
    process), where nothing caps the connections."""
    pool = settings.DATABASES["default"]["OPTIONS"].get("pool")
    if not pool:
        return None
    loop = asyncio.get_running_loop()
    gate = gates.get(loop)
    if gate is None:
        # Two connections left over for the async views' short database work.
        gate = gates[loop] = asyncio.Semaphore(max(1, pool["max_size"] - 2))
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
        body = {
            "code": "not_found",
            "message": f"no API route {request.path}",
            "data": {"path": request.path},
        }
        return JsonResponse(body, status=404)
    allowed = [m.strip() for m in response.get("Allow", "").split(",") if m.strip()]
    body = {
        "code": "method_not_allowed",
        "message": f"{request.method} is not allowed on {request.path}"
        + (f"; allowed: {', '.join(allowed)}" if allowed else ""),
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


# --- Django's middleware on the loop -----------------------------------------------------
#
# Under ASGI a stock middleware runs its process_request and its process_response each in the
# request's thread: a hop there and back (docs/performance.md, "The web edge"), 12 hops a
# request with the seven below, and a 13th for CSRF's process_view. Those that only read and
# write headers and cookies run on the loop instead (CSRF's check of an unsafe request, which
# reads the body, still runs in the thread); those that keep a browser's session (sessions,
# auth, messages) still run in the thread, and are skipped on the token paths, whose views read
# no session or user (in sync mode too, so that the tests' sync client sees what uvicorn does).


def _token_path(request: HttpRequest) -> bool:
    return request.path_info.startswith(TOKEN_PREFIXES)


class _OnLoop:
    """process_request and process_response called on the loop: they touch no database and
    read no body."""

    get_response: Callable[[HttpRequest], Any]

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        response = self.process_request(request)  # type: ignore[attr-defined]
        response = response or await self.get_response(request)
        return self.process_response(request, response)  # type: ignore[attr-defined,no-any-return]


class _BrowserOnly:
    """Not run on the token paths."""

    get_response: Callable[[HttpRequest], Any]
    async_mode: bool

    def __call__(self, request: HttpRequest) -> Any:
        if self.async_mode:
            return self.__acall__(request)
        if _token_path(request):
            return self.get_response(request)
        return super().__call__(request)  # type: ignore[misc]

    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        if _token_path(request):
            return await self.get_response(request)  # type: ignore[no-any-return]
        return await super().__acall__(request)  # type: ignore[misc,no-any-return]


class LoopSecurityMiddleware(_OnLoop, SecurityMiddleware):
    pass


class LoopCommonMiddleware(_OnLoop, CommonMiddleware):
    pass


class LoopXFrameOptionsMiddleware(_OnLoop, XFrameOptionsMiddleware):
    async def __acall__(self, request: HttpRequest) -> HttpResponseBase:
        return self.process_response(
            request, await self.get_response(request)
        )  # no process_request


class BrowserSessionMiddleware(_BrowserOnly, SessionMiddleware):
    pass


class LoopCsrfViewMiddleware(_OnLoop, CsrfViewMiddleware):
    """The token lives in a cookie (not the session), so reading and setting it is header
    arithmetic. The check of an unsafe request to a protected view reads the form, which
    Django may have spooled to disk, and a refusal renders a template: that part runs in the
    request's thread, as Django runs it."""

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        if settings.CSRF_USE_SESSIONS:
            raise ImproperlyConfigured(
                "interfaces.edge.LoopCsrfViewMiddleware keeps the CSRF token in its cookie: "
                "CSRF_USE_SESSIONS must be off"
            )
        super().__init__(get_response)
        # Django leaves a process_view that is a coroutine function on the loop and runs a plain
        # one in a thread; in sync mode the plain one stays.
        if self.async_mode:  # type: ignore[attr-defined]
            self.process_view = self._process_view_on_loop  # type: ignore[method-assign,assignment]

    async def _process_view_on_loop(
        self,
        request: HttpRequest,
        callback: Callable[..., Any],
        callback_args: Any,
        callback_kwargs: Any,
    ) -> HttpResponseBase | None:
        check = partial(
            CsrfViewMiddleware.process_view, self, request, callback, callback_args, callback_kwargs
        )
        if (
            request.method in SAFE_METHODS
            or getattr(callback, "csrf_exempt", False)
            or getattr(request, "csrf_processing_done", False)
        ):
            return check()  # answered without the body
        return await sync_to_async(check, thread_sensitive=True)()


class BrowserAuthenticationMiddleware(_BrowserOnly, AuthenticationMiddleware):
    pass


class BrowserMessageMiddleware(_BrowserOnly, MessageMiddleware):
    pass


# --- Django's ASGI handler with kept threads -----------------------------------------------

# Threads kept idle for the next requests; a burst past this many starts threads that end with it.
KEPT_THREADS: Final = 64


class KeptThreadsASGIHandler(ASGIHandler):
    """Django's ASGI handler, whose requests run their sync work on threads kept from one
    request to the next. A request still runs all of it (Django's signals, a sync view, the
    response's close) on one thread of its own, one request at a time on it, as Django runs it;
    but Django starts that thread for each request (a one-thread executor in the request's
    ``ThreadSensitiveContext``) and a second one to join it when the request ends: two thread
    starts and their GIL handoffs on every request, about as much CPU as a whole token check.
    Here a request borrows an idle executor, or makes one, and gives it back at its end. A
    thread keeps what Django keeps per thread (its database connection object, closed at each
    request's end as usual), as a WSGI server's threads do."""

    def __init__(self) -> None:
        super().__init__()
        self._idle: list[ThreadPoolExecutor] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        try:
            executor = self._idle.pop()
        except IndexError:
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentops-request")
        try:
            # Django's handler awaits every task it starts before it returns, so nothing of
            # this request uses the thread after this block.
            async with ThreadSensitiveContext(executor=executor):
                await self.handle(scope, receive, send)
        finally:
            if len(self._idle) < KEPT_THREADS:
                self._idle.append(executor)
            else:
                executor.shutdown(wait=False)  # its thread ends once its work is done
