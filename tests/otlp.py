"""A real OTLP/HTTP endpoint for the tests: an HTTP server on loopback that takes what the
service's processes export (``POST /v1/traces``, ``POST /v1/metrics``, protobuf, gzip or not),
decodes it with opentelemetry-proto and keeps it as plain values a test can search."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanProto
from opentelemetry.proto.trace.v1.trace_pb2 import Status as StatusProto

from tests.conftest import poll_until


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, which) if which else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


KINDS = {
    SpanProto.SPAN_KIND_INTERNAL: "internal",
    SpanProto.SPAN_KIND_SERVER: "server",
    SpanProto.SPAN_KIND_CLIENT: "client",
    SpanProto.SPAN_KIND_PRODUCER: "producer",
    SpanProto.SPAN_KIND_CONSUMER: "consumer",
}
STATUSES = {
    StatusProto.STATUS_CODE_UNSET: "unset",
    StatusProto.STATUS_CODE_OK: "ok",
    StatusProto.STATUS_CODE_ERROR: "error",
}


@dataclass
class Event:
    name: str
    at_ns: int
    attributes: dict[str, Any]


@dataclass
class Span:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[Event]
    links: list[tuple[str, str]]
    status: str
    status_message: str
    resource: dict[str, Any]
    scope: str

    def event(self, name: str) -> Event:
        found = [e for e in self.events if e.name == name]
        assert found, (
            f"span {self.name!r} has no event {name!r}; it has {[e.name for e in self.events]}"
        )
        return found[0]


@dataclass
class Point:
    """One metric data point: a histogram's count and sum, or a number's value."""

    metric: str
    unit: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    count: int = 0
    sum: float = 0.0
    value: float | None = None


@dataclass
class Received:
    spans: list[Span] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    requests: int = 0


class Receiver:
    """Started on a free loopback port; ``url`` is what ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes."""

    def __init__(self) -> None:
        self.received = Received()
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    receiver._traces(ExportTraceServiceRequest.FromString(body))
                    answer = ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    receiver._metrics(ExportMetricsServiceRequest.FromString(body))
                    answer = ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, name="otlp-receiver", daemon=True
        )
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _traces(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for s in scope_spans.spans:
                    spans.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=KINDS.get(s.kind, str(s.kind)),
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes=_attributes(s.attributes),
                            events=[
                                Event(e.name, e.time_unix_nano, _attributes(e.attributes))
                                for e in s.events
                            ],
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                            status=STATUSES.get(s.status.code, str(s.status.code)),
                            status_message=s.status.message,
                            resource=resource,
                            scope=scope_spans.scope.name,
                        )
                    )
        with self.lock:
            self.received.spans.extend(spans)
            self.received.requests += 1

    def _metrics(self, request: ExportMetricsServiceRequest) -> None:
        points = []
        for resource_metrics in request.resource_metrics:
            resource = _attributes(resource_metrics.resource.attributes)
            for scope_metrics in resource_metrics.scope_metrics:
                for m in scope_metrics.metrics:
                    kind = m.WhichOneof("data")
                    for p in getattr(m, kind).data_points:
                        attributes = _attributes(p.attributes)
                        if kind == "histogram":
                            points.append(
                                Point(
                                    m.name, m.unit, attributes, resource, count=p.count, sum=p.sum
                                )
                            )
                        else:
                            value = (
                                p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                            )
                            points.append(Point(m.name, m.unit, attributes, resource, value=value))
        with self.lock:
            self.received.points.extend(points)
            self.received.requests += 1

    # --- what tests read -------------------------------------------------------------------

    def spans(self, predicate: Callable[[Span], bool] = lambda s: True) -> list[Span]:
        with self.lock:
            return [s for s in self.received.spans if predicate(s)]

    def wait_spans(
        self,
        predicate: Callable[[Span], bool],
        *,
        count: int = 1,
        timeout: float = 20.0,
        what: str = "spans",
    ) -> list[Span]:
        """At least ``count`` spans matching ``predicate``, once they have arrived."""
        enough = poll_until(lambda: len(self.spans(predicate)) >= count, timeout=timeout)
        found = self.spans(predicate)
        if not enough:
            names = sorted(
                {(s.name, s.attributes.get("agentops.agent")) for s in self.spans()}, key=str
            )
            pytest.fail(
                f"timed out after {timeout} s waiting for {count} {what}; got {len(found)}. "
                f"Spans received: {names}"
            )
        return found

    def points(
        self, metric: str, predicate: Callable[[Point], bool] = lambda p: True
    ) -> list[Point]:
        with self.lock:
            return [p for p in self.received.points if p.metric == metric and predicate(p)]

    def wait_points(
        self,
        metric: str,
        predicate: Callable[[Point], bool] = lambda p: True,
        *,
        timeout: float = 20.0,
    ) -> list[Point]:
        found: list[Point] = poll_until(lambda: self.points(metric, predicate), timeout=timeout)
        if not found:
            with self.lock:
                names = sorted({p.metric for p in self.received.points})
            pytest.fail(
                f"timed out after {timeout} s waiting for metric {metric}; "
                f"metrics received: {names}"
            )
        return found


def by_agent(agent: str) -> Callable[[Span], bool]:
    return lambda s: s.attributes.get("agentops.agent") == agent
