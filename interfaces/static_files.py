"""Static files (the admin's, the dashboard's) served from WhiteNoise's index: caching headers,
compressed variants when present, ranges; no separate file server and no ``collectstatic`` step.
They are found where Django's staticfiles finders find them (each app's ``static/``) and indexed
once at start.

WhiteNoise is a WSGI application; its index and its responses (``StaticFile.get_response``) are
used here from a small ASGI app, not through asgiref's ``WsgiToAsgi``. That adapter runs the
WSGI app with a thread-sensitive ``sync_to_async`` and sends from the thread with
``async_to_sync``: the send's task resumes the connection's reading, so the next request on the
same keep-alive connection inherits that finished request's thread executor (context variables
leak between a connection's requests, CPython issue 140947) and fails with "CurrentThreadExecutor
already quit or is broken". A browser's second static file on a connection got a 500. Here file
work runs on the loop's default executor, which asks no context."""

from __future__ import annotations

import asyncio
from typing import Any, Final

from django.conf import settings
from django.contrib.staticfiles import finders
from whitenoise import WhiteNoise

CHUNK: Final = 256 * 1024


def _not_found(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
    return [b"no such static file\n"]


class StaticFiles:
    """An ASGI app answering ``STATIC_URL`` paths from WhiteNoise's index."""

    def __init__(self) -> None:
        self.index = WhiteNoise(_not_found, max_age=3600)
        for finder in finders.get_finders():
            for storage in getattr(finder, "storages", {}).values():
                self.index.add_files(storage.location, prefix=settings.STATIC_URL)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        found = self.index.files.get(scope["path"])
        if found is None:
            await _answer(send, 404, [(b"content-type", b"text/plain; charset=utf-8")])
            await send({"type": "http.response.body", "body": b"no such static file\n"})
            return
        # WhiteNoise reads the request's headers as a WSGI environ does.
        environ: dict[str, str] = {}
        for name, value in scope["headers"]:
            key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
            text = value.decode("latin-1")
            environ[key] = f"{environ[key]},{text}" if key in environ else text
        # Opening the file (and stat-free header work) off the loop: a disk may be slow.
        response = await asyncio.to_thread(found.get_response, scope["method"], environ)
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers]
        await _answer(send, int(response.status), headers)
        if response.file is None:
            await send({"type": "http.response.body", "body": b""})
            return
        try:
            while chunk := await asyncio.to_thread(response.file.read, CHUNK):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            response.file.close()


async def _answer(send: Any, status: int, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})


def static_files() -> StaticFiles:
    return StaticFiles()
