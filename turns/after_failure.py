"""What the drain does after a turn ended in failure (architecture.md §7): tell the breaker, and act
on its answer: probe the failed request without its history, shed the newest turn, queue the one
retry. The breaker decides; this module carries its decisions out for the turn."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from django.db import transaction
from opentelemetry.trace import Span

from agentops import telemetry
from agentops.models import Agent
from breaker.decision import BreakerAction, probe_verdict
from breaker.probe_call import ProbeOutcome, probe_send
from breaker.probes import ProbeTicket, breaker_probe_begin, breaker_probe_end
from breaker.services import breaker_note_failure
from breaker.shedding import ShedResult, history_shed
from calls.engine import CallRuntime
from calls.types import CompiledRequest, ProviderError
from calls.watch import Holding
from inference.models import InferenceCall, Turn
from turns.services import turn_queue_retry

logger = logging.getLogger(__name__)


async def breaker_after_failure(
    rt: CallRuntime,
    *,
    turn: Turn,
    error: ProviderError,
    failed: CompiledRequest,
    holding: Holding | None = None,
) -> None:
    """Tell the breaker about a turn that ended in failure (architecture.md §7): the streak and
    hard-down, then the probe (failures that may be the history's fault), a shed and one retry.
    Runs after the failure is recorded, on the runtime's loop, outside any transaction: the
    probe is a network call. ``holding`` is the drain's lease, for the time the probe is out."""
    db, stopping = rt.db, rt.stopping
    agent = turn.agent
    step = await db(
        breaker_note_failure, agent=agent, failure_type=error.type, http_status=error.http_status
    )
    reason = f"{error.type} at HTTP {error.http_status}: the request kept being refused"
    if step.action == BreakerAction.PROBE:
        ticket = await db(breaker_probe_begin, agent=agent)
        # The probe's call, the shed and the retry's turn are this span's children.
        with _breaker_span("agentops.breaker.probe", agent) as span:
            probe = (
                None
                if stopping.is_set()
                else await probe_send(rt, turn=turn, failed=failed, ticket=ticket, holding=holding)
            )
            if probe is None or stopping.is_set():
                # Shutdown aborts probes: whatever came back decides nothing.
                verdict: Literal["answered", "refused", "unclear", "aborted"] = "aborted"
                detail = "aborted: the service is stopping" + (
                    f" (probe call {probe.call_id}: {probe.outcome})" if probe else ""
                )
            else:
                verdict = probe_verdict(
                    failure_type=error.type,
                    failure_status=error.http_status,
                    probe_outcome=probe.outcome,
                    probe_type=probe.error.type if probe.error else None,
                    probe_status=probe.error.http_status if probe.error else None,
                )
                detail = f"probe call {probe.call_id}: {probe.outcome}" + (
                    f" ({probe.error.type}, HTTP {probe.error.http_status})" if probe.error else ""
                )
            status = await db(_probe_settled, turn, ticket, verdict, detail, reason, probe)
            if span is not None:
                span.set_attributes(
                    {
                        "agentops.breaker.verdict": status,
                        "agentops.breaker.detail": telemetry.bounded(detail),
                    }
                )
        return
    if step.action == BreakerAction.SHED:
        await db(_shed, turn, reason)
    elif step.action in (BreakerAction.STOP_CAP, BreakerAction.STOP_EMPTY):
        logger.warning(
            "agent %s: the breaker stops (%s); nothing more is set aside in this run",
            agent.name,
            step.action,
        )


def _probe_settled(
    turn: Turn,
    ticket: ProbeTicket,
    verdict: Literal["answered", "refused", "unclear", "aborted"],
    detail: str,
    reason: str,
    probe: ProbeOutcome | None,
) -> str:
    """The probe's end, what it came to on its call's row (the probes metric), and the shed
    with its marker and the retry: one transaction, under the locks of the move check."""
    with transaction.atomic():
        end = breaker_probe_end(ticket=ticket, verdict=verdict, detail=detail, shed_reason=reason)
        if probe is not None and probe.call_id is not None:
            InferenceCall.objects.filter(pk=probe.call_id).update(probe_verdict=end.status)
        if end.shed is not None:
            _retry_after_shed(turn, end.shed)
    return end.status


def _shed(turn: Turn, reason: str) -> None:
    with transaction.atomic():
        _retry_after_shed(turn, history_shed(agent=turn.agent, reason=reason))


def _retry_after_shed(turn: Turn, shed: ShedResult) -> None:
    """One retry after a shed that set something aside, in the shed's transaction."""
    set_aside = [row.seq for row in shed.rows]
    attributes = {
        "agentops.history.set_aside": set_aside,
        "agentops.breaker.sheds": shed.sheds_this_run,
        "agentops.breaker.stopped": shed.stopped or "",
    }
    with _breaker_span("agentops.breaker.shed", turn.agent, attributes):
        if shed.stopped is None:
            turn_queue_retry(agent=turn.agent, set_aside=set_aside)


@contextmanager
def _breaker_span(
    name: str, agent: Agent, attributes: dict[str, Any] | None = None
) -> Iterator[Span | None]:
    """A span of the breaker's for ``agent``, current in the block (None when nothing is
    exported), under the failed turn's span."""
    if not telemetry.enabled:
        yield None
        return
    with telemetry.tracer().start_as_current_span(
        name, attributes={"agentops.agent": agent.name, **(attributes or {})}
    ) as span:
        yield span
