"""Server spans for the web process's HTTP requests (DESIGN §16): the ASGI instrumentation of
OpenTelemetry around Django's handler, continuing a client's ``traceparent``. Each span is
named after the Django route that answers (``POST api/v1/agents/<name>/turns``), not the path,
so names stay few; a streamed response's span ends when its last event is sent. The
instrumentation reads ``OTEL_SEMCONV_STABILITY_OPT_IN`` for its HTTP attributes
(docs/observability.md)."""

from __future__ import annotations

from typing import Any

from django.urls import Resolver404, resolve


def traced_http(app: Any) -> Any:
    """``app`` (an ASGI HTTP app) with a server span around each request."""
    from opentelemetry.instrumentation.asgi import (
        OpenTelemetryMiddleware,  # only a process that exports loads it
    )

    # No span per body message received or sent: a drop-in stream sends thousands.
    return OpenTelemetryMiddleware(app, default_span_details=_span_details, exclude_spans=["receive", "send"])


def _span_details(scope: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    method = scope.get("method", "HTTP")
    try:
        route = resolve(scope.get("path", "")).route
    except Resolver404:
        return method, {}
    return f"{method} {route}", {"http.route": route}
