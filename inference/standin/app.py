"""The stand-in provider as a pure ASGI application (no framework, no Django).

See the package docstring (:mod:`inference.standin`) for the endpoints and the
scenarios.  Serve it with uvicorn, e.g. ``python -m inference.standin``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import sys
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from .anthropic_wire import AnthropicWire
from .openai_wire import OpenAIWire
from .scenarios import KEEPALIVE_SCENARIOS, Scenario, ScenarioError, parse_scenario
from .wire import (
    KEEPALIVE_COMMENT,
    Frames,
    Headers,
    Reply,
    ToolCall,
    contains_marker,
    default_answer_text,
    default_error_message,
    dumps,
    estimate_tokens,
    first_tool_name,
    last_tool_result,
    last_user_text,
    pad_message,
    retry_hints,
    signature,
    split_text,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_RECORDED = 1000
OPENAI_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
ANTHROPIC_PATHS = frozenset({"/v1/messages"})
SCENARIO_HEADER = "x-standin-scenario"

#: The wire format of one request, picked by its path.
Wire = OpenAIWire | AnthropicWire

#: A streamed reply as a sequence of steps: frames to send, or a pause (seconds).
Step = Frames | float


class Exchange:
    """One HTTP request/response on the wire.

    Watches ``receive()`` for ``http.disconnect`` so that every wait ends
    promptly when the client goes away (or the server shuts down).
    """

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
        self.gone = asyncio.Event()
        self.disconnected = False
        self.started = False
        self.complete = False
        #: Pause between consecutive frames sent with :meth:`emit`.
        self.interval = 0.0
        self._frames_sent = 0
        self._watcher: asyncio.Task[None] | None = None

    def watch(self) -> None:
        self._watcher = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        try:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    break
        except Exception:
            pass
        self.disconnected = True
        self.gone.set()

    async def close(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher

    async def sleep(self, seconds: float) -> bool:
        """Sleep; False (early) if the client is gone."""
        if self.gone.is_set():
            return False
        if seconds <= 0:
            await asyncio.sleep(0)
            return not self.gone.is_set()
        try:
            await asyncio.wait_for(self.gone.wait(), timeout=seconds)
        except TimeoutError:
            return True
        return False

    async def wait_gone(self) -> None:
        await self.gone.wait()

    async def _raw(self, message: Message) -> bool:
        if self.disconnected:
            return False
        try:
            await self._send(message)
        except Exception:  # the transport died under us
            self.disconnected = True
            self.gone.set()
            return False
        return True

    async def start(self, status: int, headers: Headers) -> bool:
        if self.gone.is_set() or self.started:
            return False
        message = {"type": "http.response.start", "status": status, "headers": headers}
        self.started = await self._raw(message)
        return self.started

    async def body(self, data: bytes, *, more: bool = True) -> bool:
        if self.gone.is_set() or self.complete:
            return False
        if not await self._raw({"type": "http.response.body", "body": data, "more_body": more}):
            return False
        self.complete = not more
        return True

    async def emit(self, frames: Iterable[bytes]) -> bool:
        """Send each frame as its own body message, ``interval`` apart."""
        for frame in frames:
            if self._frames_sent and not await self.sleep(self.interval):
                return False
            if not await self.body(frame):
                return False
            self._frames_sent += 1
        return True

    async def end(self) -> None:
        await self.body(b"", more=False)

    async def respond_json(
        self, status: int, obj: Any, headers: Iterable[tuple[bytes, bytes]] = ()
    ) -> None:
        data = dumps(obj)
        all_headers: Headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()),
            *headers,
        ]
        if await self.start(status, all_headers):
            await self.body(data, more=False)

    async def finalize(self, status: int, obj: Any) -> None:
        """Leave the HTTP exchange well-formed whatever the scenario did."""
        if self.disconnected:
            return
        if not self.started:
            data = dumps(obj)
            headers: Headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(data)).encode()),
            ]
            if await self._raw(
                {"type": "http.response.start", "status": status, "headers": headers}
            ):
                await self._raw({"type": "http.response.body", "body": data, "more_body": False})
        elif not self.complete:
            await self._raw({"type": "http.response.body", "body": b"", "more_body": False})
        self.started = self.complete = True


def _json_headers(wire: Wire) -> Headers:
    return [(b"content-type", b"application/json"), wire.request_id_header()]


def _sse_headers(wire: Wire) -> Headers:
    return [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
        wire.request_id_header(),
    ]


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
        else:
            wire = OpenAIWire(body_dict)

        exchange = Exchange(receive, send)
        exchange.watch()
        self._exchanges.add(exchange)
        if self._shutting_down:
            exchange.gone.set()
        fallback_status, fallback_message = 503, "The stand-in provider is shutting down."
        try:
            if path not in OPENAI_PATHS and path not in ANTHROPIC_PATHS:
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
                    await self._run(exchange, wire, scenario, body_dict, stream)
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

    # ------------------------------------------------------------------ #
    # Scenarios
    # ------------------------------------------------------------------ #
    async def _run(
        self, ex: Exchange, wire: Wire, sc: Scenario, body: dict[str, Any], stream: bool
    ) -> None:
        kind = sc.kind
        if kind == "sequence":
            # The n-th request carrying this exact scenario plays step n; the last step repeats.
            count = self.counters.get(sc.raw, 0) + 1
            self.counters[sc.raw] = count
            steps = sc.get_opt_str("steps").split("|")  # type: ignore[union-attr]
            await self._run(ex, wire, parse_scenario(steps[min(count, len(steps)) - 1]), body, stream)
        elif kind == "answer":
            reply = Reply(
                text=sc.get_opt_str("text") or default_answer_text(body),
                text_chunks=sc.get_int("chunks"),
            )
            await self._deliver(
                ex, wire, reply, stream, sc.seconds("interval_ms"), sc.seconds("delay_ms")
            )
        elif kind == "think":
            if last_tool_result(body) is not None:
                thought = "Thinking about the tool result."
            else:
                thought = f"Thinking about: {last_user_text(body)[:200]}"
            reply = Reply(
                text=sc.get_opt_str("text") or default_answer_text(body),
                text_chunks=sc.get_int("chunks"),
                thinking=thought,
                thinking_chunks=sc.get_int("thinking_chunks"),
            )
            await self._deliver(
                ex,
                wire,
                reply,
                stream,
                sc.seconds("interval_ms"),
                sc.seconds("delay_ms"),
                silent=sc.seconds("silent_ms"),
            )
        elif kind == "tool":
            if last_tool_result(body) is not None:
                reply = Reply(text=default_answer_text(body), text_chunks=3)
            else:
                name = sc.get_opt_str("name") or first_tool_name(body) or "lookup"
                arguments = sc.get_opt_object("arguments")
                if arguments is None:
                    arguments = {"query": last_user_text(body)[:200]}
                reply = Reply(tool=ToolCall(name, arguments), stop="tool")
            await self._deliver(
                ex, wire, reply, stream, sc.seconds("interval_ms"), sc.seconds("delay_ms")
            )
        elif kind in KEEPALIVE_SCENARIOS:
            await self._keepalives(ex, wire, sc, body, stream)
        elif kind == "silent":
            await self._silent(ex, wire, body, stream, after_chunks=None)
        elif kind == "silent-after-content":
            ex.interval = sc.seconds("interval_ms")
            await self._silent(ex, wire, body, stream, after_chunks=sc.get_int("after_chunks"), pings=sc.seconds("pings_ms"))
        elif kind == "trickle":
            await self._trickle(ex, wire, sc, body, stream)
        elif kind == "endless":
            await self._endless(ex, wire, sc, stream)
        elif kind == "error":
            await self._error(ex, wire, sc, body, stream)
        elif kind == "refuse":
            message = sc.get_opt_str("message") or "temperature is not supported with this model"
            code = "unsupported_parameter" if wire.api == "openai" else None
            await ex.respond_json(400, wire.error_body(400, message, code=code), _ids(wire))
        elif kind == "poison":
            marker = sc.get_str("marker")
            if contains_marker(body, marker):
                # Never echo the marker: the failure note quotes this message, and a note that
                # carried the marker would poison the history the breaker is trying to clear.
                message = "Invalid request: the conversation contains content this model refuses."
                await ex.respond_json(400, wire.error_body(400, message), _ids(wire))
            else:
                reply = Reply(text=default_answer_text(body), text_chunks=3)
                await self._deliver(ex, wire, reply, stream, 0.01, 0.0)
        elif kind == "context-length":
            await self._context_length(ex, wire, body)
        elif kind == "auth":
            await self._auth(ex, wire, body)
        elif kind == "length-empty":
            await self._deliver(ex, wire, Reply(text="", stop="length"), stream, 0.01, 0.0)
        elif kind == "hang":
            await ex.wait_gone()
        else:  # pragma: no cover - the scenario table and this dispatch disagree
            raise RuntimeError(f"scenario {kind!r} has no implementation")

    # -- normal replies ----------------------------------------------------
    @staticmethod
    def _reply_steps(wire: Wire, reply: Reply, silent: float = 0.0) -> list[Step]:
        """Stream steps after the stream start, through the finish frames."""
        steps: list[Step] = []
        if reply.thinking is not None:
            steps.append(wire.thinking_start())
            if silent > 0:
                steps.append(silent)
            for piece in split_text(reply.thinking, reply.thinking_chunks):
                steps.append(wire.thinking_delta(piece))
            steps.append(wire.thinking_end(signature(reply.thinking)))
        for piece in split_text(reply.text, reply.text_chunks):
            steps.append(wire.text_delta(piece))
        if reply.tool is not None:
            steps.append(wire.tool_start(wire.new_tool_id(), reply.tool.name))
            for piece in split_text(json.dumps(reply.tool.arguments), 3):
                steps.append(wire.tool_delta(piece))
        steps.append(wire.finish(reply.stop))
        return steps

    @staticmethod
    async def _play(ex: Exchange, steps: Iterable[Step]) -> bool:
        for step in steps:
            if isinstance(step, float):
                if not await ex.sleep(step):
                    return False
            elif not await ex.emit(step):
                return False
        await ex.end()
        return True

    async def _deliver(
        self,
        ex: Exchange,
        wire: Wire,
        reply: Reply,
        stream: bool,
        interval: float,
        delay: float,
        *,
        silent: float = 0.0,
    ) -> None:
        if delay > 0 and not await ex.sleep(delay):
            return
        if not stream:
            await ex.respond_json(200, wire.completion(reply), _ids(wire))
            return
        if not await ex.start(200, _sse_headers(wire)):
            return
        ex.interval = interval
        await self._play(ex, [wire.start(), *self._reply_steps(wire, reply, silent)])

    # -- keepalives, silence, trickles -------------------------------------
    async def _keepalives(
        self, ex: Exchange, wire: Wire, sc: Scenario, body: dict[str, Any], stream: bool
    ) -> None:
        if not stream:
            await ex.wait_gone()
            return
        if not await ex.start(200, _sse_headers(wire)) or not await ex.emit(wire.start()):
            return
        interval = sc.seconds("interval_ms")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + sc.seconds("duration_ms")
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            if not await ex.sleep(min(interval, remaining)):
                return
            if loop.time() >= deadline:
                break
            frames: Frames
            if sc.kind == "pings":
                frames = wire.ping()
            elif sc.kind == "comments":
                frames = [KEEPALIVE_COMMENT]
            else:
                frames = wire.empty_delta()
            if not await ex.emit(frames):
                return
        ex.interval = 0.01
        await self._play(ex, self._reply_steps(wire, Reply(text=default_answer_text(body))))

    async def _silent(
        self,
        ex: Exchange,
        wire: Wire,
        body: dict[str, Any],
        stream: bool,
        after_chunks: int | None,
        pings: float = 0.0,
    ) -> None:
        if stream:
            if not await ex.start(200, _sse_headers(wire)):
                return
            frames = wire.start()
            for i in range(after_chunks or 0):
                frames += wire.text_delta("Stand-in partial answer " if i == 0 else f"part {i} ")
            if not await ex.emit(frames):
                return
        else:
            if not await ex.start(200, _json_headers(wire)):
                return
            if after_chunks:
                data = dumps(wire.completion(Reply(text=default_answer_text(body))))
                if not await ex.body(data[: len(data) // 2]):
                    return
        # Keepalives (pings) during the silence, if asked: they must not keep the call alive.
        while stream and pings > 0 and await ex.sleep(pings):
            if not await ex.emit(wire.ping()):
                return
        await ex.wait_gone()

    async def _trickle(
        self, ex: Exchange, wire: Wire, sc: Scenario, body: dict[str, Any], stream: bool
    ) -> None:
        interval = sc.seconds("interval_ms")
        step = sc.get_int("bytes")
        sends = math.ceil(sc.get_int("duration_ms") / sc.get_int("interval_ms"))
        reply = Reply(text=default_answer_text(body))
        if not stream:
            data = dumps(wire.completion(reply))
            total = max(len(data), sends * step)
            data = data[:1] + b" " * (total - len(data)) + data[1:]
            headers = [*_json_headers(wire), (b"content-length", str(total).encode())]
            if not await ex.start(200, headers):
                return
            for pos in range(0, total, step):
                if not await ex.sleep(interval) or not await ex.body(data[pos : pos + step]):
                    return
            await ex.end()
            return
        if not await ex.start(200, _sse_headers(wire)):
            return
        pattern = b":\n"
        sent = 0
        for _ in range(sends):
            if not await ex.sleep(interval):
                return
            piece = bytes(pattern[(sent + i) % 2] for i in range(step))
            if not await ex.body(piece):
                return
            sent += step
        if sent % 2 and not await ex.body(b"\n"):  # finish the comment line
            return
        ex.interval = 0.01
        await self._play(ex, [wire.start(), *self._reply_steps(wire, reply)])

    async def _endless(self, ex: Exchange, wire: Wire, sc: Scenario, stream: bool) -> None:
        if not stream:
            await ex.wait_gone()
            return
        if not await ex.start(200, _sse_headers(wire)) or not await ex.emit(wire.start()):
            return
        ex.interval = sc.seconds("interval_ms")
        count = 0
        while await ex.emit(wire.text_delta(f"word{count} ")):
            count += 1

    # -- errors ------------------------------------------------------------
    async def _error(
        self, ex: Exchange, wire: Wire, sc: Scenario, body: dict[str, Any], stream: bool
    ) -> None:
        count = self.counters.get(sc.raw, 0) + 1
        self.counters[sc.raw] = count
        times = sc.get_opt_int("times")
        if times is not None and count > times:
            reply = Reply(text=default_answer_text(body), text_chunks=3)
            await self._deliver(ex, wire, reply, stream, 0.01, 0.0)
            return
        status = sc.get_int("status")
        form = sc.get_str("form")
        code = sc.get_opt_str("code")
        message = sc.get_opt_str("message")
        if message is None:
            message = default_error_message(status)
        message = pad_message(message, sc.get_opt_int("size"))
        headers, extra = retry_hints(form, sc.get_float("wait_ms"))
        if wire.api == "openai":
            error = wire.error_body(status, message, code=code, extra=extra)
        else:
            error = wire.error_body(status, message, type_=code, extra=extra)
        if form == "frame" and stream:
            if not await ex.start(200, _sse_headers(wire)):
                return
            ex.interval = 0.01
            frames = wire.start() + wire.text_delta("Stand-in partial answer ")
            if await ex.emit(frames) and await ex.emit(wire.error_frame(error)):
                await ex.end()
            return
        await ex.respond_json(status, error, [*headers, *_ids(wire)])

    async def _context_length(self, ex: Exchange, wire: Wire, body: dict[str, Any]) -> None:
        if wire.api == "openai":
            limit = 128000
            used = max(limit + 1873, estimate_tokens(json.dumps(body.get("messages", ""))))
            message = (
                f"This model's maximum context length is {limit} tokens. However, your messages "
                f"resulted in {used} tokens. Please reduce the length of the messages."
            )
            error = wire.error_body(400, message, code="context_length_exceeded", param="messages")
        else:
            limit = 200000
            used = max(limit + 1873, estimate_tokens(json.dumps(body.get("messages", ""))))
            message = f"prompt is too long: {used} tokens > {limit} maximum"
            error = wire.error_body(400, message)
        await ex.respond_json(400, error, _ids(wire))

    async def _auth(self, ex: Exchange, wire: Wire, body: dict[str, Any]) -> None:
        if wire.api == "openai":
            message = (
                "Incorrect API key provided: sk-stan****dein. You can find your API key at "
                "https://platform.openai.com/account/api-keys."
            )
        else:
            message = "invalid x-api-key"
        await ex.respond_json(401, wire.error_body(401, message), _ids(wire))


def _ids(wire: Wire) -> Headers:
    return [wire.request_id_header()]


def create_app() -> StandinApp:
    """A fresh stand-in ASGI application (its own request record and counters)."""
    return StandinApp()
