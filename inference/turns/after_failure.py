"""What the drain does after a turn ended in failure (DESIGN §7): tell the breaker, and act on
its answer: probe the failed request without its history, shed the newest turn, queue the one
retry. The breaker decides; this module carries its decisions out for the turn."""

from __future__ import annotations

import logging
from typing import Literal

from django.db import transaction

from agentops import lifecycle
from breaker.decision import BreakerAction, probe_verdict
from breaker.probe_call import probe_send
from breaker.probes import breaker_probe_begin, breaker_probe_end
from breaker.services import breaker_note_failure
from breaker.shedding import ShedResult, history_shed
from inference.calls.run import Holding
from inference.calls.types import CompiledRequest, ProviderError
from inference.models import InferenceCall, Turn

from .services import turn_queue_retry

logger = logging.getLogger(__name__)


def breaker_after_failure(*, turn: Turn, error: ProviderError, failed: CompiledRequest, holding: Holding | None = None) -> None:
    """Tell the breaker about a turn that ended in failure (DESIGN §7): the streak and
    hard-down, then the probe (failures that may be the history's fault), a shed and one retry.
    Runs after the failure is recorded, outside any transaction: the probe is a network call.
    ``holding`` is the drain's lease, for the time the probe is out. Blocks while the probe
    is out: call it off the background loop."""
    agent = turn.agent
    step = breaker_note_failure(agent=agent, failure_type=error.type, http_status=error.http_status)
    reason = f"{error.type} at HTTP {error.http_status}: the request kept being refused"
    if step.action == BreakerAction.PROBE:
        ticket = breaker_probe_begin(agent=agent)
        probe = None if lifecycle.stopping.is_set() else probe_send(turn=turn, failed=failed, ticket=ticket, holding=holding)
        if probe is None or lifecycle.stopping.is_set():
            # Shutdown aborts probes: whatever came back decides nothing.
            verdict: Literal["answered", "refused", "unclear", "aborted"] = "aborted"
            detail = "aborted: the service is stopping" + (f" (probe call {probe.call_id}: {probe.outcome})" if probe else "")
        else:
            verdict = probe_verdict(
                failure_type=error.type, failure_status=error.http_status, probe_outcome=probe.outcome,
                probe_type=probe.error.type if probe.error else None, probe_status=probe.error.http_status if probe.error else None,
            )
            detail = f"probe call {probe.call_id}: {probe.outcome}" + (f" ({probe.error.type}, HTTP {probe.error.http_status})" if probe.error else "")
        # The shed, its marker and the retry commit together, under the locks of the move check.
        with transaction.atomic():
            end = breaker_probe_end(ticket=ticket, verdict=verdict, detail=detail, shed_reason=reason)
            if probe is not None and probe.call_id is not None:  # what the probe came to (the probes metric)
                InferenceCall.objects.filter(pk=probe.call_id).update(probe_verdict=end.status)
            if end.shed is not None:
                _retry_after_shed(turn, end.shed)
        return
    if step.action == BreakerAction.SHED:
        with transaction.atomic():
            _retry_after_shed(turn, history_shed(agent=agent, reason=reason))
    elif step.action in (BreakerAction.STOP_CAP, BreakerAction.STOP_EMPTY):
        logger.warning("agent %s: the breaker stops (%s); nothing more is set aside in this run", agent.name, step.action)


def _retry_after_shed(turn: Turn, shed: ShedResult) -> None:
    """One retry after a shed that set something aside, in the shed's transaction."""
    if shed.stopped is None:
        turn_queue_retry(agent=turn.agent)
