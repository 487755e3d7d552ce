"""A provider call attempt in the OpenTelemetry GenAI conventions (architecture.md §16,
docs/observability.md): one CLIENT span ``chat {model}`` per attempt and the GenAI client
metrics, plus ours (cut lateness).

The span is made once the call has ended, from its result and timeline (``start_time`` the
call's send, ``end_time`` its end), under the context current where the end is recorded: a
turn's (``turns.tracing``), a request's server span (``/complete``, the drop-in
endpoints), a probe's. Nothing is traced while the call is read: its events cost what they
cost without telemetry. Called only when ``telemetry.enabled``.
"""

from __future__ import annotations

import math
from functools import cache, lru_cache
from typing import Any, Final
from urllib.parse import urlsplit

from opentelemetry.trace import SpanKind, Status, StatusCode

from agentops import telemetry
from agentops.models import Agent, Project, Provider
from calls.client import CallResult
from inference.models import InferenceCall

OPERATION: Final = "chat"
# gen_ai.provider.name for each provider kind (the wire format it speaks).
PROVIDER_NAMES: Final = {"openai": "openai", "openai-responses": "openai", "anthropic": "anthropic"}
# The GenAI conventions' advised buckets (gen_ai.client.token.usage, .operation.duration).
TOKEN_BUCKETS: Final = (
    1,
    4,
    16,
    64,
    256,
    1024,
    4096,
    16384,
    65536,
    262144,
    1048576,
    4194304,
    16777216,
    67108864,
)
DURATION_BUCKETS: Final = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
)
# How late a cut fires after its deadline, in seconds: milliseconds are the scale that matters.
LATENESS_BUCKETS: Final = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


@cache
def _instruments() -> Any:
    meter = telemetry.meter()
    return (
        meter.create_histogram(
            "gen_ai.client.operation.duration",
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
        ),
        meter.create_histogram(
            "gen_ai.client.token.usage",
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
        ),
        meter.create_histogram(
            "agentops.call.cut.lateness",
            unit="s",
            description=(
                "How long after its deadline a progress bound cut a call (architecture.md §5.3)."
            ),
            explicit_bucket_boundaries_advisory=LATENESS_BUCKETS,
        ),
    )


@lru_cache(maxsize=1024)
def project_name(project_id: int) -> str:
    """A project's name, read once per process (projects are not renamed)."""
    return str(Project.objects.filter(pk=project_id).values_list("name", flat=True).first() or "")


def error_type(result: CallResult) -> str | None:
    """``error.type`` of an attempt: the bound that cut it, else its classified error type."""
    if result.outcome == "completed":
        return None
    if result.bound is not None:
        return result.bound.value
    return result.error.type if result.error is not None else "_OTHER"


def _server(base_url: str) -> dict[str, Any]:
    parts = urlsplit(base_url)
    if not parts.hostname:
        return {}
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return {"server.address": parts.hostname, "server.port": port}


def attempt_traced(
    *, agent: Agent, call: InferenceCall, result: CallResult, served_by: Provider | None = None
) -> None:
    """Export the ended attempt's span and metrics: ``call`` its row, ``agent`` with its
    provider loaded, ``served_by`` the provider that served it when an alternate's (its model
    is the row's). Reads the project's name the first time it sees the project: call it off
    the event loop."""
    timeline = result.timeline
    model, max_tokens = call.model, call.max_tokens
    served = served_by or agent.provider
    provider = PROVIDER_NAMES.get(served.kind, served.kind)
    common: dict[str, Any] = {
        "gen_ai.operation.name": OPERATION,
        "gen_ai.provider.name": provider,
        "gen_ai.request.model": model,
        **_server(served.base_url),
    }
    output = result.output
    response_model = output.model if output is not None else ""
    if response_model:
        common["gen_ai.response.model"] = response_model
    failed = error_type(result)
    attributes: dict[str, Any] = {
        **common,
        "gen_ai.request.stream": call.streamed,
        "agentops.agent": agent.name,
        "agentops.project": project_name(agent.project_id),
        "agentops.call.id": call.pk,
        "agentops.call.kind": call.kind,
        "agentops.call.route": call.route,
        "agentops.call.route_kind": call.route_kind,
        "agentops.call.outcome": result.outcome,
        "agentops.call.model_events": timeline.model_events,
        "agentops.call.keepalives": timeline.keepalives,
    }
    if max_tokens is not None:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    if call.turn_id is not None:
        attributes["agentops.turn.id"] = call.turn_id
    if output is not None and output.stop_reason:
        attributes["gen_ai.response.finish_reasons"] = [output.stop_reason]
    if call.streamed and timeline.first_event is not None:
        attributes["gen_ai.response.time_to_first_chunk"] = (
            timeline.first_event - timeline.sent
        ) / 1000
    usage = result.usage
    for name, count in (
        ("gen_ai.usage.input_tokens", usage.input_tokens),
        ("gen_ai.usage.output_tokens", usage.output_tokens),
        ("gen_ai.usage.reasoning.output_tokens", usage.reasoning_tokens),
        ("gen_ai.usage.cache_read.input_tokens", usage.cached_input_tokens),
        ("gen_ai.usage.cache_creation.input_tokens", usage.cache_write_tokens),
    ):
        if count is not None:
            attributes[name] = count
    error = result.error
    if failed is not None:
        attributes["error.type"] = failed
    if result.bound is not None and result.lateness_ms is not None:
        attributes["agentops.cut.lateness_ms"] = result.lateness_ms
    if error is not None:
        if error.http_status is not None:
            attributes["http.response.status_code"] = error.http_status
        if error.provider_code:
            attributes["agentops.error.provider_code"] = error.provider_code
        if error.retry_after_ms is not None:
            if math.isfinite(error.retry_after_ms):
                attributes["agentops.wait.stated_ms"] = error.retry_after_ms
            else:
                attributes["agentops.wait.until_released"] = True

    ended_ms = timeline.ended if timeline.ended is not None else timeline.sent
    span = telemetry.tracer().start_span(
        f"{OPERATION} {model}",
        kind=SpanKind.CLIENT,
        attributes=attributes,
        start_time=_ns(timeline.sent),
    )
    if failed is not None:
        span.set_status(
            Status(
                StatusCode.ERROR,
                telemetry.bounded(error.message if error is not None else result.outcome),
            )
        )
    span.end(end_time=_ns(ended_ms))

    duration, tokens, lateness = _instruments()
    measured = {**common, "error.type": failed} if failed is not None else common
    duration.record(max(ended_ms - timeline.sent, 0.0) / 1000, measured)
    if usage.input_tokens is not None:
        tokens.record(usage.input_tokens, {**common, "gen_ai.token.type": "input"})
    if usage.output_tokens is not None:
        tokens.record(usage.output_tokens, {**common, "gen_ai.token.type": "output"})
    if result.bound is not None and result.lateness_ms is not None:
        lateness.record(
            max(result.lateness_ms, 0.0) / 1000,
            {**common, "agentops.cut.bound": result.bound.value},
        )


def _ns(ms: float) -> int:
    return int(ms * 1_000_000)
