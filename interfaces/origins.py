"""Which pages may open the dashboard's websocket: the site's own, exactly. A browser sends the
admin's session cookie with a websocket opened from any page, so the page's Origin must be the
site itself (scheme, host and port as the request reached the service) or one of
``CSRF_TRUSTED_ORIGINS`` (the site as the browser sees it behind a proxy). Channels' own
``AllowedHostsOriginValidator`` compares the host alone: a page on another port of an allowed
host passed it."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings

# The http scheme of a page for each websocket scheme, and the ports left out of an origin.
PAGE_SCHEME = {"ws": "http", "wss": "https"}
DEFAULT_PORT = {"http": 80, "https": 443}

Origin = tuple[str, str, int]


def _parsed(scheme: str, netloc: str) -> Origin | None:
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return scheme.lower(), parts.hostname.lower(), port or DEFAULT_PORT.get(scheme.lower(), 0)


def origin_of(value: str) -> Origin | None:
    """An Origin header's (scheme, host, port), or None for one that does not parse."""
    scheme, _, rest = value.strip().partition("://")
    return _parsed(scheme, rest.rstrip("/")) if rest else None


def same_origin(scope: dict[str, Any]) -> bool:
    headers = dict(scope.get("headers") or [])
    origin = origin_of(headers.get(b"origin", b"").decode("latin-1"))
    if origin is None:
        return False
    site = _parsed(
        PAGE_SCHEME.get(scope.get("scheme", "ws"), "http"),
        headers.get(b"host", b"").decode("latin-1"),
    )
    trusted = {origin_of(o) for o in settings.CSRF_TRUSTED_ORIGINS}
    return origin == site or origin in trusted


class SameOriginValidator:
    """ASGI middleware: a websocket whose Origin is not the site's own is denied at the
    handshake (the client reads an HTTP 403), before the application sees it."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not same_origin(scope):
            return await WebsocketDenier.as_asgi()(scope, receive, send)
        return await self.application(scope, receive, send)
