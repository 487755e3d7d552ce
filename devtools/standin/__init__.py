"""Stand-in provider: a real HTTP server imitating the OpenAI and Anthropic APIs.

Tests and the demo talk to it instead of the network.  It speaks the real wire
formats, streamed and not, so the official ``openai`` and ``anthropic`` SDKs
parse everything it sends.  It is a pure ASGI app (:mod:`devtools.standin.app`,
no framework, no Django) served by uvicorn.

Modules: ``app`` (the ASGI app: lifespan, the ``/_standin/`` control endpoints,
recording and dispatching provider requests), ``exchange`` (one request/response
on the ASGI wire, ended promptly on disconnect), ``playback`` (what each
scenario sends and when), ``scenarios`` (the scenario catalogue and its
parser), ``openai_wire`` / ``anthropic_wire`` (one module per wire format:
bodies and SSE frames), ``wire`` (what both formats share: ids, token
estimates, request reading, retry hints, text helpers), ``__main__`` (the
uvicorn server), ``listening`` (its one stdout line) and ``process`` (running
it as a subprocess).

Running it
==========

``python -m devtools.standin --host 127.0.0.1 --port 8765`` (defaults shown;
``--log-level`` defaults to ``warning``).  ``--port 0`` picks a free port.  Once
listening it prints exactly one line to stdout and flushes it::

    standin listening on http://127.0.0.1:8765

Nothing else is written to stdout (logs go to stderr).  SIGINT/SIGTERM close
open streams, answer requests that never got headers with 503, and exit 0.
From Python, :class:`devtools.standin.process.StandinProcess` starts it as a
subprocess (``with StandinProcess() as s: s.base_url``) and parses that line.

Base URLs: ``openai.OpenAI(base_url="http://HOST:PORT/v1", api_key="x")`` and
``anthropic.Anthropic(base_url="http://HOST:PORT", api_key="x")``.  Any API key
is accepted (only the ``auth`` scenario answers 401).

Endpoints
=========

``POST /v1/chat/completions`` (also ``POST /chat/completions``)
    OpenAI chat completions.  Non-streamed: a ``chat.completion`` object.  With
    ``"stream": true``: SSE ``data: {chat.completion.chunk}`` lines, then
    ``data: [DONE]``.  The first chunk is ``delta: {"role": "assistant",
    "content": ""}``; thinking is ``delta.reasoning_content`` (DeepSeek /
    OpenRouter style; non-streamed ``message.reasoning_content``); tool calls
    are ``delta.tool_calls`` (first piece carries index, id ``call_…``, type and
    function name with ``arguments: ""``, later pieces append to
    ``function.arguments``); the last chunk has an empty delta and
    ``finish_reason`` ``stop`` / ``tool_calls`` / ``length``.  With
    ``stream_options.include_usage`` a usage-only chunk (``choices: []``)
    precedes ``[DONE]``.  Errors: ``{"error": {"message", "type", "param",
    "code"}}`` plus an ``x-request-id`` header.
``POST /v1/messages``
    Anthropic messages.  Non-streamed: a ``message`` object (``msg_…`` id,
    content blocks ``thinking`` (with ``signature``) / ``text`` / ``tool_use``
    (``toolu_…`` id), ``stop_reason`` ``end_turn`` / ``tool_use`` /
    ``max_tokens``, ``usage``).  Streamed: ``event:`` + ``data:`` SSE frames
    ``message_start``, ``content_block_start``, ``content_block_delta``
    (``text_delta``, ``thinking_delta``, ``signature_delta``,
    ``input_json_delta``), ``content_block_stop``, ``message_delta``
    (stop_reason + usage), ``message_stop``; ``ping`` and ``error`` events in
    the scenarios below.  Errors: ``{"type": "error", "error": {"type",
    "message"}, "request_id"}`` plus a ``request-id`` header.
``POST /v1/responses`` (also ``POST /responses``)
    The OpenAI Responses API (:mod:`devtools.standin.responses_wire`).  The
    request's ``input`` (a string, or items: messages and
    ``function_call_output``) is read as the messages above.  Non-streamed: a
    ``response`` object (``output`` items ``reasoning`` / ``message`` /
    ``function_call``, ``usage`` with ``input_tokens_details.cached_tokens``
    and ``output_tokens_details.reasoning_tokens``).  Streamed: ``event:`` +
    ``data:`` frames ``response.created``, ``response.in_progress``,
    ``response.output_item.added`` / ``.done``,
    ``response.reasoning_summary_part.added``,
    ``response.reasoning_summary_text.delta``, ``response.content_part.added``,
    ``response.output_text.delta``, ``response.function_call_arguments.delta``
    and ``response.completed`` (``response.incomplete`` at the output limit).
    Keepalives: ``pings`` repeat ``response.in_progress``, ``empty-deltas``
    are ``""`` text deltas.  The ``frame`` error form sends an ``error`` event
    then ``response.failed``.  Errors are chat completions'.
``GET /_standin/health``
    ``{"ok": true}``.
``GET /_standin/requests``
    The recorded provider requests in arrival order (the last 1000):
    ``[{"path", "model", "scenario", "stream", "body", "headers",
    "received_at"}]``.  ``body`` is the parsed JSON (the raw text if it did not
    parse), ``headers`` maps lowercased names to values, ``scenario`` is the
    scenario string that applied (header or model), ``received_at`` a unix
    time.  Every request to a non-``/_standin/`` path is recorded when its body
    has arrived, failed and hanging ones included.
``DELETE /_standin/requests``
    Clears the record AND every ``times`` counter.  Answers ``{"ok": true}``.
``GET /_standin/open``
    ``{"open": N}``: provider requests still in progress (streaming, hanging,
    silent ...).  A request stops counting as soon as its response ends or
    its client disconnects, so tests can check that a client really let go.

Other paths answer 404, other methods 405, in the OpenAI error format.

Choosing a scenario
===================

The ``model`` field is the scenario: ``NAME`` or ``NAME:k=v,k=v`` (e.g.
``answer``, ``pings:interval_ms=50``,
``error:status=429,form=retry-after,wait_ms=2000,times=1``).  A request header
``x-standin-scenario`` overrides the model field.  Values are percent-decoded,
so a value with ``,`` or ``=`` can be written ``%2C`` / ``%3D`` (e.g.
``tool:arguments=%7B%22q%22%3A1%7D``).  An unknown NAME, an unknown or repeated
parameter, or a bad value is answered 400 ``invalid_request_error`` in that
API's format with a message naming the scenario / parameter.  The response's
``model`` echoes the request's model string.

Millisecond parameters are integers >= 0 unless noted; counts are integers.
"Text" below is always the default answer text unless ``text`` is given.

Default answer text: ``Stand-in answer to: <text of the last user message, first
200 chars>`` (the last user message that has text; "" if none).  If the LAST
message is a tool result (OpenAI role ``tool``; Anthropic a user message with
``tool_result`` blocks) it is ``Tool result received: <its content, first 200
chars>`` instead.  Tests use this echo to see what reached the provider.

Scenarios
=========

``answer`` — ``text`` (fixed reply; default: the default answer text),
    ``chunks`` (number of text deltas, >= 1, default 3), ``interval_ms``
    (between stream events, default 10), ``delay_ms`` (wait before the
    response headers, default 0).
``think`` — a thinking block, then the answer as ``answer``.  Params:
    ``thinking_chunks`` (>= 1, default 3), ``silent_ms`` (default 0: after the
    thinking block STARTS — Anthropic ``content_block_start`` of type
    ``thinking``, OpenAI a ``{"reasoning_content": ""}`` delta — nothing is sent
    for silent_ms before the first thinking delta), ``interval_ms`` (10), and
    ``text``, ``chunks``, ``delay_ms`` as in ``answer``.  Thinking text:
    ``Thinking about: <last user text>``.  Anthropic ends the block with a
    ``signature_delta``; non-streamed it has a ``signature``.
``tool`` — one tool call (OpenAI ``finish_reason: tool_calls``, Anthropic
    ``stop_reason: tool_use``), arguments streamed in 3 pieces.  Params:
    ``name`` (default: first tool name in the request's ``tools`` — OpenAI or
    Anthropic shape — else ``lookup``), ``arguments`` (a JSON object,
    percent-encoded; default ``{"query": "<last user text, 200 chars>"}``),
    ``interval_ms`` (10), ``delay_ms`` (0).  If the last message is a tool
    result it answers with text as ``answer`` does, so a round trip completes.
``pings`` / ``comments`` / ``empty-deltas`` — ``interval_ms`` (>= 1, default
    100), ``duration_ms`` (default 600000).  Streamed only; a non-streamed
    request hangs like ``hang``.  After the normal stream start (OpenAI the
    role chunk, Anthropic ``message_start``) only keepalives are sent, one
    every interval: ``pings`` = Anthropic ``event: ping``, OpenAI a usage-only
    chunk (``choices: []`` with ``usage``); ``comments`` = the SSE comment
    ``: keepalive``; ``empty-deltas`` = OpenAI ``delta: {"content": ""}``
    chunks, Anthropic one text ``content_block_start`` then ``text_delta``
    frames with ``"text": ""``.  After duration_ms the stream ends normally
    with the default answer text (one delta).
``silent`` — streamed: headers and the stream start, then nothing until the
    client disconnects.  Non-streamed: headers (chunked JSON), then nothing.
``silent-after-content`` — ``after_chunks`` (default 1), ``interval_ms`` (10),
    ``pings_ms`` (default 0: none).  Streamed: stream start, after_chunks text
    deltas, then silence until the client disconnects (with ``pings_ms``, only
    keepalive pings, as ``pings`` sends them, one every pings_ms).  Non-streamed: headers and the first half of the JSON
    body, then silence.
``trickle`` — ``interval_ms`` (>= 1, default 200), ``bytes`` (per send, >= 1,
    default 1), ``duration_ms`` (default 600000).  Non-streamed: headers (with
    ``content-length``), then the JSON body ``bytes`` bytes every interval,
    padded with whitespace (after the opening ``{``) so it lasts duration_ms;
    the body is a normal answer.  Streamed: headers, then every interval
    ``bytes`` bytes of the endless SSE comment text ``:\\n:\\n…`` (so with
    ``bytes=1`` a one-byte send each interval, a comment line every two);
    after duration_ms the comment line is completed and a normal answer
    stream follows.
``endless`` — ``interval_ms`` (>= 1, default 20): stream start then text deltas
    ``word0 word1 …`` forever until the client disconnects.  Non-streamed:
    hangs like ``hang``.
``error`` — ``status`` (400-599, default 500), ``times`` (default: always; with
    ``times=N`` only the first N requests carrying this exact scenario string
    fail, later ones answer as ``answer`` with defaults), ``form`` (default
    ``none``), ``wait_ms`` (a number, default 1000; negative, ``nan``, ``inf``
    and ``-inf`` allowed), ``code`` (provider code override), ``type`` (the
    error object's ``type`` override, e.g. a gateway's ``throttling_error``;
    for Anthropic ``type`` and ``code`` both set ``error.type``), ``message``
    (default derived from the status), ``size`` (pad the message with
    ``" xxxx…"`` to at least this many characters, e.g. 1000000 for a 1 MB
    error), ``delay_ms`` (wait before answering, default 0).  Forms (W = wait_ms, S = W/1000; numbers print as ``2000``,
    ``1.5``, ``-1``, ``nan``, ``inf``):

    * ``none`` — no retry hint.
    * ``retry-after-ms`` — header ``retry-after-ms: W``.
    * ``retry-after`` — header ``retry-after: S`` (seconds).
    * ``retry-after-date`` — header ``retry-after: <HTTP date now + W>``
      (``nan`` -> the literal ``nan``; ``inf`` -> year 9999; ``-inf`` -> 1970).
    * ``body-ms`` — ``"retry_after_ms": W`` inside the error object.
    * ``body-s`` — ``"retry_after": S`` inside the error object.
    * ``body-retry-delay`` — Google style, inside the error object:
      ``"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo",
      "retryDelay": "<S>s"}]`` (e.g. ``"2s"``, ``"1.5s"``).
    * ``llm-provider-retry-after`` / ``llm-provider-retry-after-ms`` — header
      ``llm_provider-retry-after: S`` / ``llm_provider-retry-after-ms: W`` only,
      as LiteLLM's proxy passes a provider's wait on.
    * ``x-ms-retry-after-ms`` — header ``x-ms-retry-after-ms: W`` (Azure OpenAI).
    * ``frame`` — streamed requests get HTTP 200: stream start, one text
      delta, then an error frame (Anthropic ``event: error`` with
      ``{"type": "error", "error": {...}}``; OpenAI ``data: {"error": {...}}``)
      and the connection's response ends (no ``[DONE]`` / ``message_stop``).
      Non-streamed requests get the plain HTTP error.

    In bodies, non-finite numbers are the JSON strings ``"nan"``, ``"inf"``,
    ``"-inf"`` (the body stays valid JSON).
    Error types by status — Anthropic ``error.type``: 400
    ``invalid_request_error``, 401 ``authentication_error``, 402
    ``billing_error``, 403 ``permission_error``, 404 ``not_found_error``, 413
    ``request_too_large``, 429 ``rate_limit_error``, 500 ``api_error``, 504
    ``timeout_error``, 529 ``overloaded_error``, other 5xx ``api_error``, other
    4xx ``invalid_request_error``.  OpenAI ``type``/``code``: 429
    ``requests``/``rate_limit_exceeded``, 401
    ``invalid_request_error``/``invalid_api_key``, 529
    ``overloaded_error``/``overloaded``, other 5xx ``server_error``/null, other
    4xx ``invalid_request_error``/null.  ``code=X`` sets OpenAI's ``code``
    (and also ``type`` when X is ``insufficient_quota``, as OpenAI does) and
    Anthropic's ``error.type``.
    Aliases (same params, other default status): ``rate-limit`` (429),
    ``overloaded`` (529), ``server-error`` (500).
``refuse`` — ``message`` (default ``temperature is not supported with this
    model``): every request is refused with 400 ``invalid_request_error``
    (OpenAI code ``unsupported_parameter``), a setting the model won't take.
``poison`` — ``marker`` (default ``POISON``): 400 ``invalid_request_error`` if
    ANY message (any string anywhere in it, content blocks included) or the
    Anthropic top-level ``system`` contains the marker; otherwise answers as
    ``answer``.
``context-length`` — 400.  OpenAI code ``context_length_exceeded`` (param
    ``messages``), ``This model's maximum context length is 128000 tokens.
    However, your messages resulted in N tokens. …``; Anthropic
    ``invalid_request_error`` ``prompt is too long: N tokens > 200000
    maximum``.
``auth`` — 401 in each provider's format (OpenAI ``invalid_api_key``,
    Anthropic ``authentication_error``).
``length-empty`` — a completed response stopped at the output limit with no
    text and no tool call: OpenAI ``finish_reason: length`` and content ``""``;
    Anthropic ``stop_reason: max_tokens`` and no content blocks.
``hang`` — never sends response headers; waits until the client disconnects.
``sequence`` — ``steps``: scenario strings separated by ``|`` (their own
    ``,`` ``:`` ``=`` written ``%2C`` ``%3A`` ``%3D``).  The n-th request carrying
    this exact scenario string plays step n; the last step repeats.  Counted
    like ``times`` (reset by ``DELETE /_standin/requests``).  Example:
    ``sequence:steps=silent|error%3Astatus%3D500|silent|answer``.

Counters for ``times`` are kept per exact scenario string and reset by
``DELETE /_standin/requests``.  Timing uses asyncio sleeps and each SSE event is
its own ASGI body message, so gaps are real on the socket; when the client
disconnects (``http.disconnect``) the stand-in stops sending promptly.
"""

from __future__ import annotations

from devtools.standin.app import StandinApp, create_app
from devtools.standin.listening import LISTENING_PREFIX

__all__ = ["LISTENING_PREFIX", "StandinApp", "create_app"]
