"""The breaker's probe (DESIGN §7.3), and what the runner does after a failed turn.

The probe is the failed request again with only its messages replaced (``PROBE_FIELDS`` says
what happens to each field). It is an auxiliary call: admission applies (a held model defers
it), no retries, the bounds of a non-streamed call, and nothing of it is stored in the
history. Its row is kind ``probe``. It is aborted when it is withdrawn (a later failure, a
completed call, the agent's removal), when the worker's warm shutdown begins, and when the
drain loses the agent's turn lease.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Literal

from django.db import transaction
from django.utils import timezone

from agentops import lifecycle
from agentops.live import broadcast_turn_event
from agentops.models import Agent, HistoryRow
from breaker.decision import BreakerAction, probe_verdict
from breaker.probes import ProbeTicket, breaker_probe_begin, breaker_probe_end
from breaker.services import breaker_note_failure, probe_abort_key
from breaker.shedding import ShedResult, history_shed

from .auxiliary import auxiliary_call
from .models import InferenceCall, Turn
from .services import enqueue_drain
from .types import CompiledRequest, Message, ProviderError

logger = logging.getLogger(__name__)

PROBE_TEXT = "Reply with one word."

# Every field of the failed request, and what the probe does with it. A field added to
# CompiledRequest must be placed here (a test checks), so none is dropped by accident.
PROBE_FIELDS: dict[str, Literal["kept", "replaced"]] = {
    "model": "kept",
    "system": "kept",
    "messages": "replaced",  # one message: PROBE_TEXT from a participant that is not the agent
    "max_tokens": "kept",
    "stream": "replaced",  # non-streamed, under the non-streamed bounds
    "thinking_budget": "kept",
    "tools": "kept",
}


@dataclass(frozen=True)
class ProbeOutcome:
    outcome: Literal["answered", "error", "cut", "aborted", "deferred"]
    error: ProviderError | None
    call_id: int | None


def probe_participant(agent: Agent) -> str:
    """The failed request's newest participant other than the agent, or a participant that is
    not the agent's when there is none (also when the agent itself is presented as ``User``)."""
    newest = (
        HistoryRow.objects.filter(agent=agent, state=HistoryRow.State.PRESENTED, role=HistoryRow.Role.USER)
        .exclude(participant=agent.participant)
        .order_by("-seq")
        .values_list("participant", flat=True)
        .first()
    )
    if newest:
        return str(newest)
    return "User" if agent.participant.casefold() != "user" else "Operator"


def probe_request(failed: CompiledRequest, participant: str) -> CompiledRequest:
    """Every field of the failed request kept, its messages replaced by one, non-streamed."""
    message = Message(role="user", blocks=[{"type": "text", "text": f"{participant}: {PROBE_TEXT}"}])
    return replace(failed, messages=[message], stream=False)


def probe_send(
    *, turn: Turn, failed: CompiledRequest, ticket: ProbeTicket, keep_going: Callable[[], bool] | None = None,
    waiting: Callable[[], AbstractContextManager[None]] = nullcontext,
) -> ProbeOutcome:
    """Send the probe and wait for it (off any event loop, outside any transaction). Never
    retried. A held model defers it without a call."""
    from waits.admission import admission_check

    agent = turn.agent
    if admission_check(agent=agent, model=failed.model, now_ms=time.time() * 1000) is not None:
        # A row without a call, as for a deferred auxiliary call: every probe has its row.
        now = timezone.now()
        deferred = InferenceCall.objects.create(
            turn=turn, agent=agent, kind=InferenceCall.Kind.PROBE, model=failed.model, streamed=False,
            max_tokens=failed.max_tokens, round=turn.rounds, sent_at=now, ended_at=now, outcome=InferenceCall.Outcome.DEFERRED,
        )
        return ProbeOutcome("deferred", None, deferred.pk)
    call, result = auxiliary_call(
        agent=agent, request=probe_request(failed, probe_participant(agent)), kind=InferenceCall.Kind.PROBE, turn=turn,
        abort_key=probe_abort_key(ticket.probe_id), keep_going=keep_going, waiting=waiting,
    )
    outcomes: dict[str, Literal["answered", "error", "cut", "aborted"]] = {
        "completed": "answered", "error": "error", "cut": "cut", "aborted": "aborted",
    }
    return ProbeOutcome(outcomes[result.outcome], result.error, call.pk)


def breaker_after_failure(
    *, turn: Turn, error: ProviderError, failed: CompiledRequest, keep_going: Callable[[], bool] | None = None,
    waiting: Callable[[], AbstractContextManager[None]] = nullcontext,
) -> None:
    """Tell the breaker about a turn that ended in failure (DESIGN §7): the streak and
    hard-down, then the probe (failures that may be the history's fault), a shed and one retry.
    Runs after the failure is recorded, outside any transaction: the probe is a network call.
    ``keep_going`` and ``waiting`` are the drain's, for the time the probe is out."""
    agent = turn.agent
    step = breaker_note_failure(agent=agent, failure_type=error.type, http_status=error.http_status)
    reason = f"{error.type} at HTTP {error.http_status}: the request kept being refused"
    if step.action == BreakerAction.PROBE:
        ticket = breaker_probe_begin(agent=agent)
        probe = None if lifecycle.stopping.is_set() else probe_send(turn=turn, failed=failed, ticket=ticket, keep_going=keep_going, waiting=waiting)
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
                _retry_after_shed(agent, end.shed)
        return
    if step.action == BreakerAction.SHED:
        with transaction.atomic():
            _retry_after_shed(agent, history_shed(agent=agent, reason=reason))
    elif step.action in (BreakerAction.STOP_CAP, BreakerAction.STOP_EMPTY):
        logger.warning("agent %s: the breaker stops (%s); nothing more is set aside in this run", agent.name, step.action)


def _retry_after_shed(agent: Agent, shed: ShedResult) -> None:
    """Queue one retry after a shed that set something aside: a new turn over the history with
    the newest turn set aside. Inside the shed's transaction (so both commit or neither)."""
    if shed.stopped is not None:
        return
    Agent.objects.select_for_update().get(pk=agent.pk)
    if not Turn.objects.filter(agent=agent, status__in=Turn.JOINABLE).exists():
        retry = Turn.objects.create(agent=agent, status=Turn.Status.QUEUED)
        broadcast_turn_event(retry.pk, {"type": "turn.status", "turn": retry.pk, "status": retry.status})
    enqueue_drain(agent.pk)
