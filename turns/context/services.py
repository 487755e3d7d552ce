"""Acting on the model's window for a turn (architecture.md §5.9): the plan (blocking reads,
one hop), the summary (an auxiliary call, on the loop) and the set-aside with its marker and
alert (one transaction under the agent's row lock, as every history writer)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Final, Literal

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agentops.alerts import alert_raise
from agentops.models import Agent, HistoryRow
from agentops.services import history_append
from breaker.shedding import history_set_aside
from calls.compile import SUMMARY_PREFIX, TRIM_PREFIX, presented_order
from calls.types import ProviderError
from inference.models import InferenceCall, Turn
from turns.context.estimate import (
    EstimatedRow,
    LastCall,
    fixed_tokens,
    request_estimate,
    row_tokens,
    target_tokens,
)
from turns.context.selection import Row, select

logger = logging.getLogger(__name__)

SET_ASIDE_BY: Final = "context"
SET_ASIDE_REASON: Final = "context"
NOTE_PARTICIPANT: Final = "agentops"
ALERT_KIND: Final = "context-trimmed"


@dataclass(frozen=True)
class Plan:
    """What a turn does about its window: set ``rows`` aside (``act``), or fail because the
    current turn alone does not fit (``too_big``). Tokens are estimates."""

    act: Literal["trim", "too_big"]
    policy: str
    rows: list[Row]
    tokens: int  # the rows'
    estimate: int  # the request's before the act
    window: int  # the known window; unknown, the refused request's size
    reserve: int
    kept_tokens: int  # the current turn's rows, with the system prompt and tools
    trigger: Literal["estimate", "refusal"]
    window_known: bool = True


def output_reserve(agent: Agent) -> int:
    return agent.max_tokens or int(settings.AGENTOPS_CONTEXT_OUTPUT_RESERVE)


def context_learn(*, agent: Agent, error: ProviderError) -> None:
    """Keep the window a refusal stated as the agent's learned window."""
    limit = error.context_limit
    if limit is None or limit == agent.context_learned_window:
        return
    Agent.objects.filter(pk=agent.pk).update(context_learned_window=limit)
    agent.context_learned_window = limit
    logger.warning("agent %s: the provider states a window of %d tokens", agent.name, limit)


def _presented(agent: Agent) -> list[HistoryRow]:
    """The presented rows in the order a request carries them: a summary is the oldest."""
    return presented_order(
        HistoryRow.objects.filter(agent=agent, state=HistoryRow.State.PRESENTED).order_by("seq")
    )


def _last_call(agent: Agent, fixed: int, presented: dict[HistoryRow, int]) -> LastCall | None:
    """The last completed primary call's count, with our count of the rows it carried: those
    created before it was sent that were presented then (presented now, or set aside since).
    ``presented``: the presented rows with our count of each."""
    call = (
        InferenceCall.objects.filter(
            agent=agent,
            kind=InferenceCall.Kind.PRIMARY,
            outcome=InferenceCall.Outcome.COMPLETED,
            input_tokens__isnull=False,
        )
        .order_by("-id")
        .only("input_tokens", "sent_at")
        .first()
    )
    if call is None or call.sent_at is None or call.input_tokens is None:
        return None
    sent = call.sent_at
    since = HistoryRow.objects.filter(agent=agent, set_aside_at__gte=sent)
    moved = list(since.filter(created_at__lte=sent).values_list("content", flat=True))
    counted = (
        fixed
        + sum(n for row, n in presented.items() if row.created_at <= sent)
        + sum(row_tokens(content) for content in moved)
    )
    return LastCall(
        input_tokens=call.input_tokens,
        sent_at=sent,
        counted=counted,
        moved_since=bool(moved) or since.exists(),
    )


def _protected_from(turn: Turn) -> int | None:
    first = turn.trigger_rows.order_by("seq").values_list("seq", flat=True).first()
    return int(first) if first is not None else None


def _is_note(row: HistoryRow) -> bool:
    # A summary stands for rows set aside: it ages as they would, not as a note goes first.
    return row.role == HistoryRow.Role.SYSTEM_NOTE and row.note_kind != HistoryRow.NoteKind.SUMMARY


def context_plan(*, turn: Turn, refused: ProviderError | None = None) -> Plan | None:
    """What the turn must do before its call (``refused`` None: only when the estimate plus the
    answer's reserve is over the known window), or after a refusal for length (``refused``:
    whatever the estimate says, since the provider counted otherwise).
    None: nothing to do (no window known, it fits, or the policy is ``fail``)."""
    agent = turn.agent
    policy = agent.context_policy
    window = agent.known_window
    # Most agents know no window until a refusal states it: they read nothing here.
    if policy == Agent.ContextPolicy.FAIL or (refused is None and window is None):
        return None
    presented = _presented(agent)
    tokens = {r.pk: row_tokens(r.content) for r in presented}
    fixed = fixed_tokens(agent.system, agent.tools or [])
    heuristic = fixed + sum(tokens.values())
    reserve = output_reserve(agent)
    fit = window
    last = _last_call(agent, fixed, {r: tokens[r.pk] for r in presented})
    ratio = last.ratio if last is not None else 1.0
    if refused is None:
        assert window is not None
        estimate = request_estimate(
            fixed=fixed,
            rows=[EstimatedRow(tokens[r.pk], r.created_at) for r in presented],
            last=last,
        )
        if estimate + reserve <= window:
            return None
    else:
        # The provider counted more than the estimate: what it refused, as the estimate counts,
        # is at least its window, whatever window it stated (the marker names the stated one).
        estimate = round(heuristic * ratio)
        fit = min(window or estimate + reserve, estimate + reserve)
        window = window or fit
    assert fit is not None and window is not None
    target = target_tokens(
        window=fit, reserve=reserve, margin_percent=int(settings.AGENTOPS_CONTEXT_MARGIN_PERCENT)
    )
    rows = [
        Row(
            id=r.pk,
            seq=r.seq,
            role=r.role,
            content=r.content,
            tokens=tokens[r.pk],
            participant=r.participant,
            note=_is_note(r),
        )
        for r in presented
    ]
    # The selection counts rows as we do; what must go is in the provider's tokens.
    over_by = math.ceil((estimate - target) / ratio)
    selection = select(rows, protected_from_seq=_protected_from(turn), over_by=over_by)
    trigger: Literal["estimate", "refusal"] = "refusal" if refused else "estimate"
    return Plan(
        act="trim" if selection.fits else "too_big",
        policy=policy,
        rows=selection.rows,
        tokens=round(selection.tokens * ratio),
        estimate=estimate,
        window=window,
        reserve=reserve,
        kept_tokens=round((fixed + selection.kept_tokens) * ratio),
        trigger=trigger,
        window_known=agent.known_window is not None,
    )


def too_big_error(plan: Plan, refused: ProviderError | None = None) -> ProviderError:
    """The failure of a turn whose own rows do not fit: nothing was set aside. After a refusal
    it keeps the refusal's status and code. When our estimate of the turn fits the window, the
    provider counted otherwise: the message says it refused, with our numbers beside it."""
    alone = (
        f"about {plan.kept_tokens} tokens with the system prompt and tools, and {plan.reserve} "
        "kept for the answer"
    )
    if plan.kept_tokens + plan.reserve > plan.window:
        said = (
            f"the newest turn alone ({alone}) does not fit the model's window of "
            f"{plan.window} tokens"
        )
    else:
        against = (
            f", against the model's window of {plan.window} tokens"
            if plan.window_known
            else "; no window is configured or stated"
        )
        said = (
            "the provider refused even the newest turn alone as too long (our estimate: "
            f"{alone}{against})"
        )
    return ProviderError(
        type="context_length",
        http_status=refused.http_status if refused else None,
        provider_code=refused.provider_code if refused else None,
        message=f"{said}; nothing was set aside",
        context_limit=plan.window,
    )


def trim_text(count: int, tokens: int, window: int) -> str:
    return (
        f"{TRIM_PREFIX} The {count} oldest rows (about {tokens} tokens) were set aside to fit "
        f"the model's window of {window} tokens."
    )


def context_set_aside(*, turn: Turn, plan: Plan, summary: str | None = None) -> HistoryRow | None:
    """Set the plan's rows aside (reason ``context``), write the one marker note (or with a
    summary, the ``[context-summary]`` note in their place) and raise the ``context-trimmed``
    alert, in one transaction under the agent's row lock. None, and nothing done, when any of
    the rows moved since the plan was made (the caller plans again)."""
    ids = [r.id for r in plan.rows]
    with transaction.atomic():
        agent = Agent.objects.select_for_update().get(pk=turn.agent_id)
        still = HistoryRow.objects.filter(pk__in=ids, state=HistoryRow.State.PRESENTED).count()
        if still != len(ids):
            return None
        history_set_aside(row_ids=ids, by=SET_ASIDE_BY, reason=SET_ASIDE_REASON, now=timezone.now())
        text = trim_text(len(ids), plan.tokens, plan.window)
        if summary is not None:
            text = f"{SUMMARY_PREFIX} {text.removeprefix(TRIM_PREFIX + ' ')} In summary: {summary}"
        note = history_append(
            agent=agent,
            participant=NOTE_PARTICIPANT,
            role=HistoryRow.Role.SYSTEM_NOTE,
            content=text,
            note_kind=HistoryRow.NoteKind.TRIM if summary is None else HistoryRow.NoteKind.SUMMARY,
        )
        alert_raise(
            kind=ALERT_KIND,
            agent=agent.name,
            model=agent.model,
            verdict=plan.trigger,
            message=trim_text(len(ids), plan.tokens, plan.window)
            + (" A summary stands in their place." if summary is not None else "")
            + " They stay in the record; an operator can restore them.",
            data={
                "turn": turn.pk,
                "rows": len(ids),
                "seqs": [r.seq for r in plan.rows],
                "tokens": plan.tokens,
                "estimate": plan.estimate,
                "window": plan.window,
                "policy": plan.policy,
                "summarized": summary is not None,
                "trigger": plan.trigger,
            },
        )
    return note
