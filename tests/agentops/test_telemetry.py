"""What ``telemetry_setup`` installs from the standard environment (architecture.md §16): each case
in a process of its own, as a web process, a worker or beat starts (the SDK's providers are set once
per process). The exporters point at a loopback port nobody listens on: nothing here waits for an
export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from agentops import telemetry
from tests.conftest import BASE_DIR
from turns.services import IncomingMessage, turn_submit

NOWHERE = "http://127.0.0.1:9"

PROBE = """
import json, sys
from opentelemetry import metrics, trace
from agentops import telemetry
on = telemetry.telemetry_setup(role="worker", worker="w1@example")
out = {"enabled": on, "tracer_provider": type(trace.get_tracer_provider()).__name__,
       "meter_provider": type(metrics.get_meter_provider()).__name__,
       "sdk_loaded": "opentelemetry.sdk.trace" in sys.modules}
provider = trace.get_tracer_provider()
if hasattr(provider, "resource"):
    processors = provider._active_span_processor._span_processors
    out.update(resource=dict(provider.resource.attributes),
               sampler=provider.sampler.get_description(),
               processors=[type(p).__name__ for p in processors],
               exporters=[(type(p.span_exporter).__name__, p.span_exporter._endpoint)
                          for p in processors])
print(json.dumps(out))
"""


def setup_in_a_process(**env: str) -> dict[str, Any]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=BASE_DIR,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_with_no_endpoint_nothing_is_installed_and_the_sdk_is_not_even_loaded() -> None:
    found = setup_in_a_process()
    assert found == {
        "enabled": False,
        "tracer_provider": "ProxyTracerProvider",
        "meter_provider": "_ProxyMeterProvider",
        "sdk_loaded": False,
    }


def test_a_disabled_sdk_wins_over_an_endpoint() -> None:
    found = setup_in_a_process(OTEL_EXPORTER_OTLP_ENDPOINT=NOWHERE, OTEL_SDK_DISABLED="true")
    assert (
        found["enabled"] is False
        and found["tracer_provider"] == "ProxyTracerProvider"
        and not found["sdk_loaded"]
    )


def test_an_endpoint_exports_spans_through_the_batch_processor_over_otlp_http() -> None:
    found = setup_in_a_process(OTEL_EXPORTER_OTLP_ENDPOINT=NOWHERE)
    assert (
        found["enabled"] is True
        and found["tracer_provider"] == "TracerProvider"
        and found["meter_provider"] == "MeterProvider"
    )
    assert found["processors"] == ["BatchSpanProcessor"]
    assert found["exporters"] == [["OTLPSpanExporter", f"{NOWHERE}/v1/traces"]]
    resource = found["resource"]
    assert resource["service.name"] == "agentops" and resource["agentops.process.role"] == "worker"
    assert resource["agentops.worker.name"] == resource["service.instance.id"] == "w1@example"
    assert resource["host.name"] and isinstance(resource["process.pid"], int)
    assert found["sampler"].startswith("ParentBased{root:AlwaysOnSampler")


def test_the_standard_variables_name_the_service_add_resource_attributes_and_choose_the_sampler() -> (
    None
):
    found = setup_in_a_process(
        OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{NOWHERE}/traces",
        OTEL_SERVICE_NAME="gateway",
        OTEL_RESOURCE_ATTRIBUTES="deployment.environment.name=prod,service.instance.id=i-1",
        OTEL_TRACES_SAMPLER="always_off",
    )
    assert found["exporters"] == [["OTLPSpanExporter", f"{NOWHERE}/traces"]]
    # A traces endpoint alone exports no metrics (metrics would go to an address nobody set).
    assert found["meter_provider"] == "_ProxyMeterProvider"
    resource = found["resource"]
    assert (
        resource["service.name"] == "gateway" and resource["deployment.environment.name"] == "prod"
    )
    assert resource["service.instance.id"] == "i-1"  # the environment's word wins over ours
    assert found["sampler"] == "AlwaysOffSampler"


@pytest.mark.django_db
def test_with_telemetry_off_a_submitted_turn_stores_no_span(
    make_agent: Any, no_workers: None
) -> None:
    assert not telemetry.enabled  # the test process exports nothing
    turn, _ = turn_submit(
        agent_id=make_agent().pk, messages=[IncomingMessage(participant="alice", content="hi")]
    )
    turn.refresh_from_db()
    assert turn.trace_context is None


LOGGED = """
import logging
import django
django.setup()
from opentelemetry import trace
from agentops import telemetry
telemetry.telemetry_setup(role="worker", worker="w1@example")
log = logging.getLogger("agentops.test")
with telemetry.tracer().start_as_current_span("a span") as span:
    log.warning("inside")
    ids = span.get_span_context()
    print(trace.format_trace_id(ids.trace_id), trace.format_span_id(ids.span_id))
log.warning("outside")
"""


def logged_in_a_process(log_format: str) -> tuple[list[str], str, str]:
    """The stderr lines a worker process logs inside a span and outside one, and the span's
    ids (nothing is exported: the sampler drops the span, its ids stay current)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env = {
        **clean,
        "DJANGO_SETTINGS_MODULE": "agentops.settings",
        "AGENTOPS_LOG_FORMAT": log_format,
        "OTEL_EXPORTER_OTLP_ENDPOINT": NOWHERE,
        "OTEL_TRACES_SAMPLER": "always_off",
        "OTEL_METRICS_EXPORTER": "none",
    }
    done = subprocess.run(
        [sys.executable, "-c", LOGGED],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    trace_id, span_id = done.stdout.split()
    return [line for line in done.stderr.splitlines() if "side" in line], trace_id, span_id


def test_a_text_log_line_names_its_process_and_the_current_spans_ids() -> None:
    (inside, outside), trace_id, span_id = logged_in_a_process("text")
    assert (
        inside.endswith(f"inside trace_id={trace_id} span_id={span_id}")
        and " WARNING agentops.test [w1@example pid " in inside
    )
    assert outside.endswith("]: outside") and "trace_id" not in outside


def test_a_json_log_line_carries_the_host_the_worker_and_the_current_spans_ids() -> None:
    lines, trace_id, span_id = logged_in_a_process("json")
    inside, outside = (json.loads(line) for line in lines)
    assert (
        inside["message"] == "inside"
        and inside["trace_id"] == trace_id
        and inside["span_id"] == span_id
    )
    assert inside["worker"] == "w1@example" and inside["host"] and inside["pid"]
    assert (
        outside["message"] == "outside" and "trace_id" not in outside and "span_id" not in outside
    )
