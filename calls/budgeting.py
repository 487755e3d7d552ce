"""A call's reservation on its agent's budgets, just before it is sent (architecture.md §18):
its worst case worked out from the request and the prices in force, and, when a budget refuses
it, the result of a call never sent."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import cache, partial
from typing import Any, Final

from django.conf import settings

from agentops.budgets import Reserved, budget_reserve, reservation_amount
from agentops.models import Agent
from agentops.prices import price_in_force
from calls.client import CallResult, Timeline, now_ms
from calls.types import ProviderError

# The error type of a call a budget refused: held until the reset, sent to a cheaper target, or
# called again once the calls in flight settle.
BUDGET_ERRORS: Final = {"held": "budget", "edge": "budget_edge", "busy": "budget_busy"}


@dataclass(frozen=True)
class Reservation:
    """What a call reserved (``reserved``, ``amount``: its worst case) or why it is not sent
    (``refused``)."""

    reserved: list[Reserved]
    amount: Decimal | None = None
    refused: CallResult | None = None


def call_reservation(
    *,
    agent: Agent,
    provider_id: int,
    model: str,
    body: Any,
    max_tokens: int | None,
    look_elsewhere: bool,
    now: datetime,
) -> Reservation:
    """Reserve the call's worst case on the agent's budgets. ``look_elsewhere``: at the edge,
    the same request's worst case on the agent's other targets may send it there (§18.4)."""

    @cache
    def given() -> int:
        # The body's size in bytes bounds its tokens: a token is at least a byte.
        return len(json.dumps(body, ensure_ascii=False).encode())

    def on(target: int, target_model: str) -> Decimal | None:
        """The request's worst case on a target (worked out only when a budget counts it)."""
        terms = price_in_force(provider_id=target, model=target_model, at=now)
        if terms is None:
            return None
        most = max_tokens or settings.AGENTOPS_BUDGET_DEFAULT_MAX_TOKENS
        return reservation_amount(input_tokens=given(), max_tokens=most, terms=terms)

    def others() -> list[Decimal]:
        found = [on(t, m) for t, m in agent.targets() if (t, m) != (provider_id, model)]
        return [amount for amount in found if amount is not None]

    outcome, amount = budget_reserve(
        agent=agent,
        worst_case=partial(on, provider_id, model),
        now=now,
        others=others if look_elsewhere else list,
    )
    if isinstance(outcome, list):
        return Reservation(outcome, amount)
    at = now_ms()
    refused = CallResult(
        outcome="error",
        timeline=Timeline(sent=at, ended=at),
        error=ProviderError(
            type=BUDGET_ERRORS[outcome.kind],
            provider_code=BUDGET_ERRORS[outcome.kind],
            retryable=outcome.kind == "busy",
            message=outcome.reason,
        ),
    )
    return Reservation([], amount, refused)
