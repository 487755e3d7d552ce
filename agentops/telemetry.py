"""OpenTelemetry in every process (architecture.md §16, docs/observability.md).

``telemetry_setup`` gives a process the SDK's tracer and meter providers when the standard
environment asks for an export (``OTEL_EXPORTER_OTLP_ENDPOINT``, or a signal's own endpoint):
spans go through the SDK's batch span processor and metrics through its periodic reader, both
over OTLP/HTTP (protobuf), configured by the usual ``OTEL_*`` variables (service name,
resource attributes, sampler, batch delays, headers). Unset, or with ``OTEL_SDK_DISABLED``
true, nothing is installed: ``enabled`` stays False, and every caller checks it before doing
any telemetry work, so spans, attributes and exporters cost nothing.

A span that outlives the process that starts it (a turn: submitted in the web process, ended
by whichever process ends it) is *stored*: its ids, its parent, its start, the events and the
links it gathers are a JSON value kept on its row (``span_stored``, ``stored_event``,
``stored_link``). Its children anywhere take ``stored_context`` as their parent, and the
process that ends it re-creates it with the stored ids and start through the SDK's own
extension points (an id generator, ``start_time``) and ends it there (``stored_span_end``):
the SDK ends every span in the process that started it.

Every log line names its process and, while a span is current, its trace and span ids
(``LogContext``); failures.log records carry the same (``process_identity``, ``trace_ids``).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger(__name__)

# Whether this process exports telemetry: set once, by ``telemetry_setup``.
enabled = False

SCOPE: Final = "agentops"
# The conventions our own spans and metrics follow (docs/observability.md): those of the
# opentelemetry-semantic-conventions package the SDK brings, GenAI at "latest experimental".
SCHEMA_URL: Final = "https://opentelemetry.io/schemas/1.44.0"
# A stored span keeps at most this many events and links; past them the rest are counted.
STORED_EVENTS_LIMIT: Final = 64
STORED_LINKS_LIMIT: Final = 32
# The longest text an event attribute or a status description carries.
ATTRIBUTE_TEXT_LIMIT: Final = 300

_HOST: Final = socket.gethostname()
_identity = {"role": "", "worker": ""}

# The ids ``stored_span_end`` re-creates a span with, for the one ``start_span`` it makes.
_pinned: ContextVar[tuple[int, int] | None] = ContextVar("agentops_pinned_span_ids", default=None)
_w3c = TraceContextTextMapPropagator()


# --- the process ---------------------------------------------------------------------------


def process_named(*, role: str, worker: str = "") -> None:
    """Name this process (``web``, ``worker``, ``beat``) and, for a worker, its Celery node
    name: log lines, lease owners and the telemetry resource carry them."""
    _identity["role"], _identity["worker"] = role, worker


def process_identity() -> dict[str, Any]:
    """The host, the process id and the Celery worker name ("" outside a worker)."""
    return {"host": _HOST, "pid": os.getpid(), "worker": _identity["worker"]}


def process_label() -> str:
    """How a log line names its process: ``<worker name> pid <pid>`` for a worker,
    ``<role>@<host> pid <pid>`` otherwise."""
    who = _identity["worker"] or f"{_identity['role'] or 'agentops'}@{_HOST}"
    return f"{who} pid {os.getpid()}"


# --- setting up ------------------------------------------------------------------------------


def _set(name: str) -> bool:
    return bool(os.environ.get(name, "").strip())


def _exporter_off(signal: str) -> bool:
    return os.environ.get(f"OTEL_{signal}_EXPORTER", "").strip().lower() == "none"


def exports_wanted() -> tuple[bool, bool]:
    """Whether the environment asks for traces and for metrics over OTLP: an endpoint for the
    signal (its own, or ``OTEL_EXPORTER_OTLP_ENDPOINT``), its exporter not ``none``, and the
    SDK not disabled."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False, False
    common = _set("OTEL_EXPORTER_OTLP_ENDPOINT")
    traces = (common or _set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) and not _exporter_off("TRACES")
    metrics_ = (common or _set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")) and not _exporter_off(
        "METRICS"
    )
    return traces, metrics_


def telemetry_setup(*, role: str, worker: str = "") -> bool:
    """Name the process and, when the environment asks for an export, install the SDK's
    providers with their OTLP/HTTP exporters (once per process). Returns ``enabled``.

    The SDK reads the rest of the standard environment itself: ``OTEL_SERVICE_NAME``
    (default here ``agentops``), ``OTEL_RESOURCE_ATTRIBUTES`` (overriding ours),
    ``OTEL_TRACES_SAMPLER``, ``OTEL_BSP_*``, ``OTEL_METRIC_EXPORT_INTERVAL``, the exporters'
    headers, timeouts and compression. Both providers flush and shut down at exit."""
    global enabled
    process_named(role=role, worker=worker)
    if enabled:
        return True
    traces, metrics_ = exports_wanted()
    if not (traces or metrics_):
        return False
    # Imported here: a process that exports nothing never loads the SDK.
    from opentelemetry.sdk.metrics import MeterProvider

    resource = _resource()
    if traces:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider = TracerProvider(resource=resource, id_generator=_stored_ids())
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
    if metrics_:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        metrics.set_meter_provider(
            MeterProvider(
                resource=resource,
                metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())],
            )
        )
    enabled = True
    logger.info(
        "telemetry: exporting %s over OTLP/HTTP as service %s",
        " and ".join(s for s, on in (("traces", traces), ("metrics", metrics_)) if on),
        resource.attributes.get("service.name"),
    )
    return True


def _resource() -> Any:
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    ours: dict[str, Any] = {
        "service.name": "agentops",
        "host.name": _HOST,
        "process.pid": os.getpid(),
        "agentops.process.role": _identity["role"] or "agentops",
    }
    if _identity["worker"]:
        ours["agentops.worker.name"] = _identity["worker"]
        ours["service.instance.id"] = _identity["worker"]
    # What the environment says (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME) wins over ours.
    return Resource.create({**ours, **OTELResourceDetector().detect().attributes})


def telemetry_flush(timeout_s: float = 5.0) -> None:
    """Export what this process still holds (a worker's warm shutdown calls it before exit)."""
    if not enabled:
        return
    for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
        flush = getattr(provider, "force_flush", None)
        if flush is not None:
            try:
                flush(int(timeout_s * 1000))
            except Exception:  # telemetry never stops a shutdown
                logger.warning("telemetry: could not flush at shutdown", exc_info=True)


def tracer() -> trace.Tracer:
    return trace.get_tracer(SCOPE, schema_url=SCHEMA_URL)


def meter() -> metrics.Meter:
    return metrics.get_meter(SCOPE, schema_url=SCHEMA_URL)


def bounded(text: str) -> str:
    return text if len(text) <= ATTRIBUTE_TEXT_LIMIT else text[: ATTRIBUTE_TEXT_LIMIT - 1] + "…"


# --- logs ------------------------------------------------------------------------------------


def trace_ids() -> dict[str, str]:
    """``{"trace_id", "span_id"}`` (hex) of the span current here; empty when there is none."""
    if not enabled:
        return {}
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return {}
    return {
        "trace_id": trace.format_trace_id(span_context.trace_id),
        "span_id": trace.format_span_id(span_context.span_id),
    }


class LogContext(logging.Filter):
    """Names each record's process and, while a span is current, its trace, for the formatter
    of ``settings.LOGGING`` (``AGENTOPS_LOG_FORMAT``). ``fields="text"``: ``where``
    (``process_label``) and ``trace`` (`` trace_id=… span_id=…``, or empty). ``"json"``:
    ``host``, ``worker`` (for a worker) and, while a span is current, ``trace_id`` and
    ``span_id``, which the JSON formatter writes as fields of their own."""

    def __init__(self, fields: str = "text") -> None:
        super().__init__()
        self.json = fields == "json"

    def filter(self, record: logging.LogRecord) -> bool:
        ids = trace_ids()
        if self.json:
            record.host = _HOST
            if _identity["worker"]:
                record.worker = _identity["worker"]
            for name, value in ids.items():
                setattr(record, name, value)
            return True
        record.where = process_label()
        record.trace = f" trace_id={ids['trace_id']} span_id={ids['span_id']}" if ids else ""
        return True


# --- spans that outlive a process ---------------------------------------------------------------


def _stored_ids() -> Any:
    """The SDK's random id generator, except for the one span ``stored_span_end`` re-creates:
    that one gets the ids it was stored with."""
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class StoredIds(RandomIdGenerator):
        def generate_span_id(self) -> int:
            pinned = _pinned.get()
            return pinned[1] if pinned is not None else super().generate_span_id()

        def generate_trace_id(self) -> int:
            pinned = _pinned.get()
            return pinned[0] if pinned is not None else super().generate_trace_id()

    return StoredIds()


def _carrier(span_context: SpanContext) -> dict[str, str]:
    carrier: dict[str, str] = {}
    _w3c.inject(carrier, context=trace.set_span_in_context(NonRecordingSpan(span_context)))
    return carrier


def _span_context(carrier: dict[str, str]) -> SpanContext:
    return trace.get_current_span(_w3c.extract(carrier)).get_span_context()


def span_stored(name: str, *, attributes: dict[str, Any]) -> dict[str, Any] | None:
    """Start the span ``name`` under the current context, to fix its ids and its sampling
    decision, and return it as it is stored on its row; None when nothing is exported (or no
    span could be made). The span object is dropped unended: ``stored_span_end`` ends it."""
    if not enabled:
        return None
    span = tracer().start_span(name, attributes=attributes)
    span_context = span.get_span_context()
    if not span_context.is_valid:
        return None
    parent = trace.get_current_span().get_span_context()
    return {
        "span": _carrier(span_context),
        "parent": _carrier(parent) if parent.is_valid else None,
        "start_ns": getattr(span, "start_time", None) or time.time_ns(),
        "events": [],
        "links": [],
    }


def stored_context(stored: dict[str, Any] | None) -> otel_context.Context | None:
    """A context whose current span is the stored one (its children's parent), or None."""
    if not enabled or not stored or not isinstance(stored.get("span"), dict):
        return None
    span_context = _span_context(stored["span"])
    if not span_context.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(span_context))


@contextmanager
def current(ctx: otel_context.Context | None) -> Iterator[None]:
    """``ctx`` as the current context in this block (nothing when None)."""
    if ctx is None:
        yield
        return
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


def stored_event(name: str, attributes: dict[str, Any]) -> list[Any]:
    """One event as a stored span keeps it: ``[name, unix ns, attributes]``."""
    return [name, time.time_ns(), attributes]


def stored_link() -> dict[str, str] | None:
    """The current span, as a stored span keeps a link to it (a request that joined a turn)."""
    span_context = trace.get_current_span().get_span_context()
    return _carrier(span_context) if span_context.is_valid else None


def stored_span_end(
    stored: dict[str, Any] | None,
    name: str,
    *,
    attributes: dict[str, Any],
    error_type: str | None = None,
    message: str = "",
) -> None:
    """Re-create the stored span with its ids, parent, start, events and links, and end it
    now (``error_type`` set: ended in error, with ``message``). Nothing when not enabled or
    nothing was stored."""
    if not enabled or not stored or not isinstance(stored.get("span"), dict):
        return
    span_context = _span_context(stored["span"])
    if not span_context.is_valid:
        return
    parent = (
        _w3c.extract(stored["parent"])
        if isinstance(stored.get("parent"), dict)
        else otel_context.Context()
    )
    links = [
        Link(c)
        for c in (_span_context(carrier) for carrier in stored.get("links") or [])
        if c.is_valid
    ]
    token = _pinned.set((span_context.trace_id, span_context.span_id))
    try:
        span = tracer().start_span(
            name,
            context=parent,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            links=links,
            start_time=int(stored["start_ns"]),
        )
    finally:
        _pinned.reset(token)
    for event_name, at_ns, event_attributes in stored.get("events") or []:
        span.add_event(event_name, event_attributes, timestamp=int(at_ns))
    if error_type is not None:
        span.set_attribute("error.type", error_type)
        span.set_status(Status(StatusCode.ERROR, bounded(message)))
    span.end()
