"""The stand-in provider as a pure ASGI application (no framework, no Django).

:class:`StandinApp` answers lifespan events, the ``/_standin/`` control
endpoints (health, the recorded requests, open requests) and the provider
endpoints: it records each provider request, picks its wire format by path,
parses the scenario and hands the request to
:func:`devtools.standin.playback.play_scenario`.  See docs/standin.md
(:mod:`devtools.standin`) for the endpoints and the scenarios.  Serve it with
uvicorn, e.g. ``python -m devtools.standin``.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections import deque
from typing import Any

from devtools.standin.anthropic_wire import AnthropicWire
from devtools.standin.exchange import Exchange, Receive, Scope, Send
from devtools.standin.openai_wire import OpenAIWire
from devtools.standin.playback import Wire, play_scenario
from devtools.standin.responses_wire import ResponsesWire, as_messages
from devtools.standin.scenarios import ScenarioError, parse_scenario
from devtools.standin.wire import dumps

MAX_RECORDED = 1000
OPENAI_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
ANTHROPIC_PATHS = frozenset({"/v1/messages"})
RESPONSES_PATHS = frozenset({"/v1/responses", "/responses"})
SCENARIO_HEADER = "x-standin-scenario"


class StandinApp:
    """ASGI application imitating the OpenAI and Anthropic HTTP APIs."""

    def __init__(self, max_recorded: int = MAX_RECORDED) -> None:
        self.requests: deque[dict[str, Any]] = deque(maxlen=max_recorded)
        self.counters: dict[str, int] = {}
        self._exchanges: set[Exchange] = set()
        self._shutting_down = False

    # ------------------------------------------------------------------ #
    # ASGI entry
    # ------------------------------------------------------------------ #
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope.get("path", "/")
        if path.startswith("/_standin/") or path == "/_standin":
            await self._inspect(scope, send)
            return
        body = await self._read_body(receive)
        if body is None:
            return  # disconnected while sending the request
        await self._provider(scope, receive, send, body)

    def begin_shutdown(self) -> None:
        """End every open wait: streams are closed, unanswered requests get 503."""
        self._shutting_down = True
        for exchange in list(self._exchanges):
            exchange.gone.set()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.begin_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    @staticmethod
    async def _read_body(receive: Receive) -> bytes | None:
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)

    # ------------------------------------------------------------------ #
    # Inspection endpoints
    # ------------------------------------------------------------------ #
    async def _inspect(self, scope: Scope, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        obj: Any
        status, obj = 200, None
        if path == "/_standin/health" and method in ("GET", "HEAD"):
            obj = {"ok": True}
        elif path == "/_standin/requests" and method == "GET":
            obj = list(self.requests)
        elif path == "/_standin/open" and method == "GET":
            obj = {"open": len(self._exchanges)}
        elif path == "/_standin/requests" and method == "DELETE":
            self.requests.clear()
            self.counters.clear()
            obj = {"ok": True}
        elif path in ("/_standin/health", "/_standin/requests", "/_standin/open"):
            status, obj = 405, {"error": {"message": f"method {method} not allowed on {path}"}}
        else:
            status, obj = 404, {"error": {"message": f"no stand-in endpoint {path}"}}
        data = dumps(obj)
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else data})

    # ------------------------------------------------------------------ #
    # Provider endpoints
    # ------------------------------------------------------------------ #
    def _record(
        self,
        scope: Scope,
        raw_body: bytes,
        body: Any,
        headers: dict[str, str],
        scenario: str | None,
    ) -> None:
        recorded_body: Any = body
        if body is None and raw_body:
            recorded_body = raw_body.decode("utf-8", "replace")
        model = body.get("model") if isinstance(body, dict) else None
        self.requests.append(
            {
                "path": scope["path"],
                "model": model,
                "scenario": scenario,
                "stream": bool(body.get("stream")) if isinstance(body, dict) else False,
                "body": recorded_body,
                "headers": headers,
                "received_at": time.time(),
            }
        )

    async def _provider(self, scope: Scope, receive: Receive, send: Send, raw: bytes) -> None:
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", []):
            key, text = name.decode("latin-1").lower(), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        body: Any = None
        body_error: str | None = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body_error = "We could not parse the JSON body of your request."
        else:
            body_error = "The request body is empty; expected a JSON object."
        if body_error is None and not isinstance(body, dict):
            body_error = "The request body must be a JSON object."
        body_dict: dict[str, Any] = body if isinstance(body, dict) else {}
        scenario_raw: str | None = headers.get(SCENARIO_HEADER) or None
        if scenario_raw is None and isinstance(body_dict.get("model"), str):
            scenario_raw = body_dict["model"]
        self._record(scope, raw, body, headers, scenario_raw)

        path, method = scope["path"], scope["method"]
        wire: Wire
        if path in ANTHROPIC_PATHS:
            wire = AnthropicWire(body_dict)
        elif path in RESPONSES_PATHS:
            wire = ResponsesWire(body_dict)
        else:
            wire = OpenAIWire(body_dict)

        exchange = Exchange(receive, send)
        exchange.watch()
        self._exchanges.add(exchange)
        if self._shutting_down:
            exchange.gone.set()
        fallback_status, fallback_message = 503, "The stand-in provider is shutting down."
        try:
            if path not in OPENAI_PATHS | ANTHROPIC_PATHS | RESPONSES_PATHS:
                message = f"Invalid URL ({method} {path})"
                await exchange.respond_json(404, wire.error_body(404, message))
            elif method != "POST":
                message = f"Method {method} not allowed on {path}; use POST."
                await exchange.respond_json(405, wire.error_body(405, message))
            elif body_error is not None:
                await exchange.respond_json(400, wire.error_body(400, body_error))
            elif scenario_raw is None:
                message = "You must provide a model parameter (the stand-in scenario)."
                await exchange.respond_json(400, wire.error_body(400, message, param="model"))
            else:
                try:
                    scenario = parse_scenario(scenario_raw)
                except ScenarioError as exc:
                    await exchange.respond_json(400, wire.error_body(400, str(exc), param="model"))
                else:
                    stream = bool(body_dict.get("stream"))
                    # The scenarios read a chat-shaped body; a Responses request's input is one.
                    played = as_messages(body_dict) if path in RESPONSES_PATHS else body_dict
                    await play_scenario(exchange, wire, scenario, played, stream, self.counters)
        except Exception as exc:  # a stand-in bug: make it visible, answer 500
            traceback.print_exc(file=sys.stderr)
            fallback_status = 500
            fallback_message = f"stand-in internal error: {exc!r}"
        finally:
            self._exchanges.discard(exchange)
            await exchange.finalize(
                fallback_status, wire.error_body(fallback_status, fallback_message)
            )
            await exchange.close()


def create_app() -> StandinApp:
    """A fresh stand-in ASGI application (its own request record and counters)."""
    return StandinApp()
