"""Django's middleware on the ASGI path (``interfaces.edge``): a token request runs no middleware
step in a thread and still gets the security headers; a browser's session, login and CSRF check
still work. Through Django's AsyncClient, which loads the middleware in async mode as the ASGI
handler does (with the body in memory: a spooled body is not exercised here)."""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from django.contrib.auth.models import User
from django.test import AsyncClient

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def hops(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Every call the request makes into a thread, by the function it runs there."""
    seen: Counter[str] = Counter()
    original = SyncToAsync.__call__

    async def counted(self: SyncToAsync, *args: Any, **kwargs: Any) -> Any:
        seen[getattr(self.func, "__qualname__", repr(self.func))] += 1
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "__call__", counted)
    yield seen


async def test_a_token_request_hops_to_a_thread_only_for_its_view_and_djangos_signals(
    hops: Counter[str], make_agent: Any, user_token: str
) -> None:
    agent = await sync_to_async(make_agent)()
    hops.clear()
    response = await AsyncClient().get(
        f"/api/v1/agents/{agent.name}", headers={"Authorization": f"Bearer {user_token}"}
    )
    assert response.status_code == 200, response.content
    # request_started, the view, the response's close (request_finished): no middleware step.
    assert sum(hops.values()) == 3, dict(hops)
    assert not [name for name in hops if "Middleware" in name], dict(hops)
    # The header middleware still ran, on the loop; the session's did not.
    assert response["X-Content-Type-Options"] == "nosniff"
    assert response["X-Frame-Options"] == "DENY"
    assert response["Referrer-Policy"] == "same-origin"
    assert "Set-Cookie" not in response.headers and "Cookie" not in response.get("Vary", "")


async def test_a_browser_logs_in_to_the_admin_through_its_session_and_csrf_token() -> None:
    await sync_to_async(User.objects.create_superuser)(
        "ops", "ops@example.com", "a long passphrase"
    )
    browser = AsyncClient(enforce_csrf_checks=True)
    page = await browser.get("/admin/login/")
    assert page.status_code == 200
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())
    assert csrf is not None and "csrftoken" in page.cookies
    form = {"username": "ops", "password": "a long passphrase", "next": "/admin/"}

    refused = await browser.post("/admin/login/", form)  # no CSRF token in the form
    assert refused.status_code == 403
    # The middleware's own check (the login view has a decorator of its own): ``/`` has none.
    assert (await browser.post("/", {})).status_code == 403
    assert "sessionid" not in browser.cookies

    signed_in = await browser.post("/admin/login/", {**form, "csrfmiddlewaretoken": csrf.group(1)})
    assert (signed_in.status_code, signed_in["Location"]) == (302, "/admin/")
    assert "sessionid" in browser.cookies
    admin = await browser.get("/admin/")
    assert admin.status_code == 200 and "ops" in admin.content.decode()
    assert admin["X-Frame-Options"] == "DENY"


async def _asgi_get(app: Any, path: str) -> int:
    """One GET through the ASGI application, as uvicorn hands it over; its status."""
    sent: list[dict[str, Any]] = []
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 5000),
        "server": ("testserver", 80),
    }
    await app(scope, receive, send)
    return int(sent[0]["status"])


async def test_requests_one_after_another_run_on_one_kept_thread_and_concurrent_ones_on_threads_of_their_own() -> (
    None
):
    from django.core.signals import request_started

    from interfaces.asgi import django_asgi_app

    threads: list[int] = []

    def started(**kwargs: Any) -> None:
        threads.append(threading.get_ident())

    request_started.connect(started)
    try:
        for _ in range(5):
            assert await _asgi_get(django_asgi_app, "/favicon.ico") == 200
        assert len(set(threads)) == 1  # Django alone starts a thread (and a joiner) per request
        before = threading.active_count()
        threads.clear()
        assert (
            await asyncio.gather(*(_asgi_get(django_asgi_app, "/favicon.ico") for _ in range(4)))
            == [200] * 4
        )
        assert len(set(threads)) == 4  # each request its own thread, as Django runs them
        threads.clear()
        for _ in range(5):
            assert await _asgi_get(django_asgi_app, "/favicon.ico") == 200
        assert len(set(threads)) == 1
        assert threading.active_count() <= before + 3  # the burst's threads are kept, none more
    finally:
        request_started.disconnect(started)
