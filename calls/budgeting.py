"""A call's reservation on its agent's budgets, just before it is sent (architecture.md §18):
its estimate worked out from the wire request and the prices in force, the output bound it is
sent with, and, when a budget refuses it, the result of a call never sent."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import cache, partial
from typing import Any, Final

from django.conf import settings

from agentops.budget_core import Estimate, reservation_estimate
from agentops.budgets import Reserved, budget_reserve
from agentops.estimate import ratio, row_tokens
from agentops.models import Agent
from agentops.prices import PriceBook, price_in_force
from calls.client import CallResult, Timeline, now_ms
from calls.types import ProviderError
from inference.models import InferenceCall

# The error type of a call a budget refused: held until the reset, sent to a cheaper target,
# called again once the calls in flight settle, or refused for good (too large, unpriced).
BUDGET_ERRORS: Final = {
    "held": "budget",
    "edge": "budget_edge",
    "busy": "budget_busy",
    "too_large": "budget_refused",
    "unpriced": "budget_refused",
}
# The field that bounds a reply's length in each wire format's request, and the others a client
# may have used for it.
OUTPUT_BOUND: Final = {
    "openai": "max_tokens",
    "anthropic": "max_tokens",
    "openai-responses": "max_output_tokens",
}
OUTPUT_BOUNDS: Final = ("max_tokens", "max_completion_tokens", "max_output_tokens")
# The fields of a request the model reads as input, in every wire format.
INPUT_FIELDS: Final = ("system", "instructions", "messages", "input", "tools")


@dataclass(frozen=True)
class Reservation:
    """What a call reserved (``reserved``, ``estimate``) or why it is not sent (``refused``);
    ``max_tokens``: the output bound to send it with when the request had none (a budget counts
    it, so the provider must not bill past what it reserved); ``input_estimate``: our count of
    its input tokens, kept on its row to calibrate the next."""

    reserved: list[Reserved]
    estimate: Estimate | None = None
    refused: CallResult | None = None
    max_tokens: int | None = None
    input_estimate: int | None = None


def input_tokens(body: Any) -> int:
    """Our count of a wire request's input tokens: each message at its JSON's characters over 4
    plus its framing (agentops.estimate), the system prompt, instructions and tools likewise."""
    if not isinstance(body, dict):
        return row_tokens(body)
    total = 0
    for field in INPUT_FIELDS:
        value = body.get(field)
        if value is None:
            continue
        if isinstance(value, list) and field != "tools":
            total += sum(row_tokens(item) for item in value)
        else:
            total += row_tokens(value)
    return total


def output_bound(body: Any) -> int | None:
    """The output bound the wire request states, if any."""
    if isinstance(body, dict):
        for field in OUTPUT_BOUNDS:
            value = body.get(field)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def choices(body: Any) -> int:
    """How many completions the request asks for (Chat Completions' ``n``): each is billed."""
    n = body.get("n") if isinstance(body, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def calibrated(*, agent: Agent, provider_id: int, model: str, counted: int) -> int:
    """``counted`` at the rate the provider counted the agent's last call to this target (its
    reported input over our count of it), when that call has both."""
    last = (
        InferenceCall.objects.filter(
            agent_id=agent.pk, provider_id=provider_id, model=model, input_tokens__isnull=False
        )
        .order_by("-id")
        .values_list("input_tokens", "input_estimate")
        .first()
    )
    if last is None or last[0] is None or last[1] is None:
        return counted
    return round(counted * ratio(reported=last[0], counted=last[1]))


def call_reservation(
    prices: PriceBook,
    *,
    agent: Agent,
    provider_id: int,
    provider_kind: str,
    model: str,
    body: Any,
    max_tokens: int | None,
    look_elsewhere: bool,
    now: datetime,
) -> Reservation:
    """Reserve the call's estimate on the agent's budgets. ``look_elsewhere``: at the edge,
    the same request's estimate on the agent's other targets may send it there (§18.4)."""
    stated = output_bound(body) or max_tokens
    most = stated or settings.AGENTOPS_BUDGET_DEFAULT_MAX_TOKENS
    n = choices(body)
    margin = int(settings.AGENTOPS_BUDGET_MARGIN_PERCENT)

    @cache
    def counted() -> int:
        return input_tokens(body)

    def on(target: int, target_model: str) -> Estimate | None:
        """The request's estimate on a target (worked out only when a budget counts it)."""
        terms = price_in_force(prices, provider_id=target, model=target_model, at=now)
        if terms is None:
            return None
        given = calibrated(agent=agent, provider_id=target, model=target_model, counted=counted())
        return reservation_estimate(
            input_tokens=given, max_tokens=most, choices=n, terms=terms, margin_percent=margin
        )

    def others() -> list[Decimal]:
        found = [on(t, m) for t, m in agent.targets() if (t, m) != (provider_id, model)]
        return [e.amount for e in found if e is not None]

    outcome, estimate = budget_reserve(
        agent=agent,
        estimate=partial(on, provider_id, model),
        now=now,
        others=others if look_elsewhere else list,
        unpriced=settings.AGENTOPS_BUDGET_UNPRICED,
    )
    if isinstance(outcome, list):
        bound = most if outcome and stated is None and provider_kind in OUTPUT_BOUND else None
        return Reservation(
            outcome, estimate, max_tokens=bound, input_estimate=counted() if outcome else None
        )
    at = now_ms()
    refused = CallResult(
        outcome="error",
        timeline=Timeline(sent=at, ended=at),
        error=ProviderError(
            type=BUDGET_ERRORS[outcome.kind],
            provider_code=outcome.field or BUDGET_ERRORS[outcome.kind],
            retryable=outcome.kind == "busy",
            message=outcome.reason,
            resets_at_ms=outcome.resets_at.timestamp() * 1000 if outcome.kind == "held" else None,
        ),
    )
    return Reservation([], estimate, refused)
