"""The probe's call (architecture.md §7.3): the failed request again with only its messages replaced
(``PROBE_FIELDS`` says what happens to each field), sent as an auxiliary call. Admission
applies (a held model defers it), no retries, the bounds of a non-streamed call, and nothing of
it is stored in the history. Its row is kind ``probe``. It is aborted when it is withdrawn (a
later failure, a completed call, the agent's removal), when the worker's warm shutdown begins,
and when the drain loses the agent's turn lease. Its verdict is ``breaker.probes``'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Literal

from agentops.models import Agent, HistoryRow
from calls.engine import CallRuntime
from calls.run import ProviderCall
from calls.types import CompiledRequest, Message, ProviderError
from calls.watch import Holding, Watch
from inference.models import InferenceCall, Turn
from waits.admission import admission_check

from .probes import ProbeTicket
from .services import probe_abort_key

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
        HistoryRow.objects.filter(
            agent=agent, state=HistoryRow.State.PRESENTED, role=HistoryRow.Role.USER
        )
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
    message = Message(
        role="user", blocks=[{"type": "text", "text": f"{participant}: {PROBE_TEXT}"}]
    )
    return replace(failed, messages=[message], stream=False)


async def probe_send(
    rt: CallRuntime,
    *,
    turn: Turn,
    failed: CompiledRequest,
    ticket: ProbeTicket,
    holding: Holding | None = None,
) -> ProbeOutcome:
    """Send the probe and wait for it, on the running loop (outside any transaction). Never
    retried. A held model defers it without a call. ``holding`` is the drain's lease: the
    probe is aborted if it is lost while the probe is out."""
    call = await rt.db(_probe_prepared, rt, turn, failed)
    if isinstance(call, InferenceCall):
        return ProbeOutcome("deferred", None, call.pk)
    watch = Watch(abort_key=probe_abort_key(ticket.probe_id), holding=holding)
    result = await call.run(watch=watch)
    await rt.db(call.end)
    outcomes: dict[str, Literal["answered", "error", "cut", "aborted", "deferred"]] = {
        "completed": "answered",
        "error": "error",
        "cut": "cut",
        "aborted": "aborted",
        "deferred": "deferred",  # its project's limit had no room (architecture.md §6.14)
    }
    return ProbeOutcome(outcomes[result.outcome], result.error, call.row.pk)


def _probe_prepared(
    rt: CallRuntime, turn: Turn, failed: CompiledRequest
) -> ProviderCall | InferenceCall:
    """The probe's call, or the ``deferred`` row written when a wait holds the model."""
    agent = turn.agent
    if admission_check(agent=agent, model=failed.model, now_ms=time.time() * 1000) is not None:
        return ProviderCall.deferred(
            rt.prices,
            agent=agent,
            kind=InferenceCall.Kind.PROBE,
            model=failed.model,
            max_tokens=failed.max_tokens,
            turn=turn,
        )
    request = probe_request(failed, probe_participant(agent))
    return ProviderCall(rt, agent, request, InferenceCall.Kind.PROBE, turn=turn)
