"""A provider that serves a real shared quota (architecture.md §6.12, §6.13): N requests per
fixed window per model, counted across every agent and process that calls it, with the
remaining-quota headers of either dialect and the providers' own wordings when it refuses.

Each scenario is a path prefix, configured by ``POST /_quota/config {"scenario": ..., ...}``:

- ``limit`` (requests per window, default 5) and ``window_ms`` (default 2000), windows counted
  from the scenario's first request (each request's ``window`` is in the log);
- ``dialect``: ``openai`` (``x-ratelimit-*``, resets as ``1.234s``) or ``anthropic``
  (``anthropic-ratelimit-*``, RFC 3339 resets);
- ``mode``: ``quota`` (the window's limit, refused in the provider's organization wording with
  ``retry-after-ms`` to the window's end), ``insufficient_quota`` (every request refused: the
  credit is spent), ``acceleration`` (the first ``times`` requests refused in acceleration
  wording, with ``retry_after_ms`` if given), ``spend_cap`` (Anthropic's monthly cap), ``503``
  (every request answered 503);
- ``latency_ms``: how long each answer takes.

OpenAI's wire format at ``/{scenario}/v1/chat/completions`` and Anthropic's at
``/{scenario}/v1/messages``, streamed or not as asked. ``GET /_quota/log`` lists every request
(scenario, model, at_ms, status). Run it with ``python -m tests.quota``; it prints
``quota listening on URL``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

CONFIG: dict[str, dict[str, Any]] = {}
LOG: list[dict[str, Any]] = []
COUNTS: defaultdict[tuple[str, str, int], int] = defaultdict(int)
REFUSED: defaultdict[str, int] = defaultdict(int)


def _now_ms() -> float:
    return time.time() * 1000


def _window(cfg: dict[str, Any], now: float) -> tuple[int, float]:
    """The fixed window ``now`` falls in, counted from the scenario's first request."""
    width = float(cfg.get("window_ms", 2000))
    start = cfg.setdefault("first_ms", now)
    index = int((now - start) // width)
    return index, start + (index + 1) * width


def _quota_headers(
    cfg: dict[str, Any], remaining: int, reset_ms: float, now: float
) -> dict[str, str]:
    limit = int(cfg.get("limit", 5))
    left = max(0.0, reset_ms - now)
    if cfg.get("dialect", "openai") == "anthropic":
        instant = datetime.fromtimestamp(reset_ms / 1000, UTC).isoformat().replace("+00:00", "Z")
        return {
            "anthropic-ratelimit-requests-limit": str(limit),
            "anthropic-ratelimit-requests-remaining": str(remaining),
            "anthropic-ratelimit-requests-reset": instant,
        }
    return {
        "x-ratelimit-limit-requests": str(limit),
        "x-ratelimit-remaining-requests": str(remaining),
        "x-ratelimit-reset-requests": f"{left / 1000:.3f}s",
    }


def _refusal(cfg: dict[str, Any], model: str, kind: str, wait_ms: float | None) -> web.Response:
    anthropic = kind == "anthropic"
    mode = cfg.get("mode", "quota")
    headers: dict[str, str] = {}
    if wait_ms is not None:
        headers["retry-after-ms"] = str(int(wait_ms))
    if mode == "insufficient_quota":
        body: dict[str, Any] = {
            "error": {
                "message": "You exceeded your current quota, please check your plan and billing details.",
                "type": "insufficient_quota",
                "param": None,
                "code": "insufficient_quota",
            }
        }
    elif mode == "spend_cap":
        body = {
            "type": "error",
            "error": {
                "type": "rate_limit_error",
                "message": "Your organization has reached its monthly usage limit.",
                "details": {"error_code": "enforced_spend_limit_reached"},
            },
        }
    elif mode == "acceleration":
        message = (
            "This request would exceed your organization's acceleration limit: "
            "please ramp up your usage gradually."
        )
        body = (
            {"type": "error", "error": {"type": "rate_limit_error", "message": message}}
            if anthropic
            else {"error": {"message": message, "type": "requests", "code": "rate_limit_exceeded"}}
        )
    elif anthropic:
        body = {
            "type": "error",
            "error": {
                "type": "rate_limit_error",
                "message": "This request would exceed the rate limit for your organization "
                f"of {cfg.get('limit', 5)} requests per minute.",
            },
        }
    else:
        body = {
            "error": {
                "message": f"Rate limit reached for {model} in organization org-test on requests "
                f"per min (RPM): Limit {cfg.get('limit', 5)}, Used {cfg.get('limit', 5)}, "
                "Requested 1.",
                "type": "requests",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }
    return web.json_response(body, status=429, headers=headers)


async def _answer(request: web.Request, kind: str) -> web.StreamResponse:
    scenario = request.match_info["scenario"]
    cfg = CONFIG.get(scenario, {})
    payload = await request.json()
    model = str(payload.get("model", ""))
    now = _now_ms()
    entry: dict[str, Any] = {"scenario": scenario, "model": model, "at_ms": now, "status": 200}
    entry["window"] = _window(cfg, now)[0]
    LOG.append(entry)
    mode = cfg.get("mode", "quota")
    if mode == "503":
        entry["status"] = 503
        return web.json_response(
            {"error": {"message": "The server is overloaded.", "type": "server_error"}}, status=503
        )
    if mode in ("insufficient_quota", "spend_cap"):
        entry["status"] = 429
        return _refusal(cfg, model, kind, None)
    if mode == "acceleration" and REFUSED[scenario] < int(cfg.get("times", 1)):
        REFUSED[scenario] += 1
        entry["status"] = 429
        return _refusal(cfg, model, kind, cfg.get("retry_after_ms"))
    index, reset = _window(cfg, now)
    limit = int(cfg.get("limit", 5))
    used = COUNTS[(scenario, model, index)]
    if used >= limit and mode == "quota":
        entry["status"] = 429
        response = _refusal(cfg, model, kind, reset - now)
        response.headers.update(_quota_headers(cfg, 0, reset, now))
        return response
    COUNTS[(scenario, model, index)] = used + 1
    headers = _quota_headers(cfg, max(0, limit - used - 1), reset, now)
    if cfg.get("latency_ms"):
        await asyncio.sleep(float(cfg["latency_ms"]) / 1000)
    text = f"ok from {model}"
    if payload.get("stream"):
        stream = web.StreamResponse(
            headers={**headers, "content-type": "text/event-stream", "cache-control": "no-cache"}
        )
        await stream.prepare(request)
        for event in _events(kind, model, text):
            await stream.write(event.encode())
        await stream.write_eof()
        return stream
    if kind == "anthropic":
        body: dict[str, Any] = {
            "id": "msg_q",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 3},
        }
    else:
        body = {
            "id": "chatcmpl-q",
            "object": "chat.completion",
            "created": int(now / 1000),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
        }
    return web.json_response(body, headers=headers)


def _events(kind: str, model: str, text: str) -> list[str]:
    if kind == "anthropic":
        frames = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_q",
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "usage": {"input_tokens": 10, "output_tokens": 0},
                    },
                },
            ),
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": text},
                },
            ),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": 3},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        return [f"event: {name}\ndata: {json.dumps(data)}\n\n" for name, data in frames]
    chunks: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
        },
    ]
    out = [
        "data: "
        + json.dumps({"id": "chatcmpl-q", "object": "chat.completion.chunk", "model": model, **c})
        + "\n\n"
        for c in chunks
    ]
    return [*out, "data: [DONE]\n\n"]


async def openai(request: web.Request) -> web.StreamResponse:
    return await _answer(request, "openai")


async def anthropic(request: web.Request) -> web.StreamResponse:
    return await _answer(request, "anthropic")


async def config(request: web.Request) -> web.Response:
    body = await request.json()
    scenario = body.pop("scenario")
    CONFIG[scenario] = body
    REFUSED.pop(scenario, None)
    return web.json_response({"ok": True})


async def log(request: web.Request) -> web.Response:
    return web.json_response(LOG)


async def clear(request: web.Request) -> web.Response:
    LOG.clear()
    return web.json_response({"ok": True})


def app() -> web.Application:
    application = web.Application()
    application.add_routes(
        [
            web.post("/_quota/config", config),
            web.get("/_quota/log", log),
            web.delete("/_quota/log", clear),
            web.post("/{scenario}/v1/chat/completions", openai),
            web.post("/{scenario}/v1/messages", anthropic),
        ]
    )
    return application


async def main(host: str, port: int) -> None:
    runner = web.AppRunner(app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()  # type: ignore[union-attr]
    print(f"quota listening on http://{bound[0]}:{bound[1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.host, args.port))
