"""Static files (the admin's, the dashboard's) served by WhiteNoise: caching headers, compressed
variants when present, ranges; no separate file server and no ``collectstatic`` step. They are
found where Django's staticfiles finders find them (each app's ``static/``) and indexed once at
start. WhiteNoise is a WSGI application, so only ``STATIC_URL`` requests reach it (through
asgiref's adapter): every other request stays on the async path."""

from __future__ import annotations

from typing import Any

from asgiref.wsgi import WsgiToAsgi
from django.conf import settings
from django.contrib.staticfiles import finders
from whitenoise import WhiteNoise


def _not_found(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
    return [b"no such static file\n"]


def static_files() -> WsgiToAsgi:
    served = WhiteNoise(_not_found, max_age=3600)
    for finder in finders.get_finders():
        for storage in getattr(finder, "storages", {}).values():
            served.add_files(storage.location, prefix=settings.STATIC_URL)
    return WsgiToAsgi(served)
