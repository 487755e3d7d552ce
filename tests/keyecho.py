"""A provider that echoes the key it was sent, every way a provider or a gateway in front of one
has been seen to (architecture.md §15): a small aiohttp server on loopback that speaks the three
wire formats (``POST /v1/chat/completions``, ``/v1/messages``, ``/v1/responses``). The
request's ``model`` picks what it does:

- ``echo-401``: a 401 whose JSON error message quotes the request's credential header as it
  came (``authorization: Bearer <key>``, or Anthropic's ``x-api-key: <key>``), the key bare,
  its first 12 characters masked as OpenAI masks a key, and the other key it was started with
  (a gateway's key for another provider, ``KEYECHO_ALSO``); the same key in its ``x-request-id``
  and ``www-authenticate`` headers;
- ``echo-frame``: a 200 stream whose first event is the format's error frame refusing the key,
  saying the same;
- anything else: a short answer (streamed or not, as asked).

``GET /_echo/requests`` lists the requests received (path, model, headers, body);
``DELETE /_echo/requests`` clears them. Run it with ``python -m tests.keyecho --host 127.0.0.2
--port 0``; it prints ``keyecho listening on URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from typing import Any

from aiohttp import web

received: list[dict[str, Any]] = []


def presented(request: web.Request) -> tuple[str, str]:
    """The credential header as it came (``name: value``) and the bare key."""
    if "x-api-key" in request.headers:
        key = request.headers["x-api-key"]
        return f"x-api-key: {key}", key
    value = request.headers.get("authorization", "")
    return f"authorization: {value}", value.removeprefix("Bearer ")


def words(request: web.Request) -> str:
    header, key = presented(request)
    also = os.environ.get("KEYECHO_ALSO", "")
    return (
        f"Incorrect API key provided: {header}. The key {key} (shown as {key[:12]}****"
        f"{key[-4:]}) is not valid here; the gateway's other key is {also}."
    )


def error_object(path: str, message: str, *, in_stream: bool = False) -> dict[str, Any]:
    """The format's refusal of a key, as a body or (``in_stream``) a frame."""
    if path.endswith("/messages"):
        return {"type": "error", "error": {"type": "authentication_error", "message": message}}
    if path.endswith("/responses") and in_stream:
        return {"type": "error", "code": "invalid_api_key", "message": message, "param": None}
    return {
        "error": {"message": message, "type": "invalid_request_error", "code": "invalid_api_key"}
    }


def frame(path: str, message: str) -> bytes:
    data = json.dumps(error_object(path, message, in_stream=True)).encode()
    if path.endswith(("/messages", "/responses")):
        return b"event: error\ndata: " + data + b"\n\n"
    return b"data: " + data + b"\n\n"


def answer(path: str, text: str) -> dict[str, Any]:
    if path.endswith("/messages"):
        return {
            "id": "msg_echo",
            "type": "message",
            "role": "assistant",
            "model": "echo",
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 3, "output_tokens": 2},
        }
    if path.endswith("/responses"):
        return {
            "id": "resp_echo",
            "object": "response",
            "status": "completed",
            "model": "echo",
            "output": [
                {
                    "type": "message",
                    "id": "msg_echo",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "usage": {"input_tokens": 3, "output_tokens": 2, "total_tokens": 5},
        }
    return {
        "id": "chatcmpl-echo",
        "object": "chat.completion",
        "created": 0,
        "model": "echo",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }


async def provider(request: web.Request) -> web.StreamResponse:
    raw = await request.read()
    body = json.loads(raw or b"{}")
    received.append(
        {
            "path": request.path,
            "model": body.get("model"),
            "headers": dict(request.headers),
            "body": raw.decode(),
        }
    )
    model = body.get("model")
    _, key = presented(request)
    if model == "echo-401":
        return web.json_response(
            error_object(request.path, words(request)),
            status=401,
            headers={"x-request-id": f"req-{key}", "www-authenticate": f'Bearer realm="{key}"'},
        )
    if model == "echo-frame" and body.get("stream"):
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(frame(request.path, words(request)))
        await response.write_eof()
        return response
    return web.json_response(answer(request.path, "echoed nothing"))


async def requests_view(request: web.Request) -> web.Response:
    if request.method == "DELETE":
        received.clear()
        return web.json_response({"ok": True})
    return web.json_response(received)


async def serve(host: str, port: int) -> None:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("GET", "/_echo/requests", requests_view)
    app.router.add_route("DELETE", "/_echo/requests", requests_view)
    app.router.add_route("POST", "/{tail:.*}", provider)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
    print(f"keyecho listening on http://{bound[0]}:{bound[1]}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.2")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
