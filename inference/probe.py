"""The breaker's probe (DESIGN §7.3): the failed request again with only its messages replaced.

The probe is an auxiliary call: admission applies (a held model defers it), no retries, the
bounds of a non-streamed call, and nothing of it is stored in the history. Its row is kind
``probe``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Literal

from django.utils import timezone

from agentops.models import Agent, HistoryRow

from .auxiliary import auxiliary_call
from .models import InferenceCall, Turn
from .types import CompiledRequest, Message, ProviderError

PROBE_TEXT = "Reply with one word."


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


def probe_send(*, turn: Turn, failed: CompiledRequest) -> ProbeOutcome:
    """Send the probe and wait for it (off any event loop). Never retried."""
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
        agent=agent, request=probe_request(failed, probe_participant(agent)), kind=InferenceCall.Kind.PROBE, turn=turn
    )
    outcomes: dict[str, Literal["answered", "error", "cut", "aborted"]] = {
        "completed": "answered", "error": "error", "cut": "cut", "aborted": "aborted",
    }
    return ProbeOutcome(outcomes[result.outcome], result.error, call.pk)
