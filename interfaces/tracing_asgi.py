"""Server spans for the web process's HTTP requests (architecture.md §16): the ASGI instrumentation
of OpenTelemetry around Django's handler, continuing a client's ``traceparent``. Each span is
named after the Django route that answers (``POST api/v1/agents/<name>/turns``), not the path,
so names stay few; a streamed response's span ends when its last event is sent. Health probes,
metric scrapes and static files are not traced unless ``OTEL_PYTHON_ASGI_EXCLUDED_URLS`` (or
``OTEL_PYTHON_EXCLUDED_URLS``) says otherwise. The instrumentation reads
``OTEL_SEMCONV_STABILITY_OPT_IN`` for its HTTP attributes (docs/observability.md)."""

from __future__ import annotations

import os
from typing import Any, Final

from django.urls import Resolver404, resolve

# Regular expressions searched in each request's URL: what a load balancer or Prometheus asks
# every few seconds would bury the requests that matter.
EXCLUDED_URLS: Final = r"/health(\?|$),/metrics(\?|$),/static/,/favicon\.ico"


def traced_http(app: Any) -> Any:
    """``app`` (an ASGI HTTP app) with a server span around each request."""
    # Only a process that exports loads the instrumentation.
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from opentelemetry.util.http import parse_excluded_urls

    excluded = os.environ.get(
        "OTEL_PYTHON_ASGI_EXCLUDED_URLS", os.environ.get("OTEL_PYTHON_EXCLUDED_URLS", EXCLUDED_URLS)
    )
    # No span per body message received or sent: a drop-in stream sends thousands.
    return OpenTelemetryMiddleware(
        app,
        excluded_urls=parse_excluded_urls(excluded),
        default_span_details=_span_details,
        exclude_spans=["receive", "send"],
    )


def _span_details(scope: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    method = scope.get("method", "HTTP")
    try:
        route = resolve(scope.get("path", "")).route
    except Resolver404:
        return method, {}
    return f"{method} {route}", {"http.route": route}
