"""How many tokens a request holds, without a tokenizer (architecture.md §5.9, "The estimate").

No tokenizer is downloaded at run time (a machine without internet could not fetch one), so a
row counts as its JSON's characters over ``CHARS_PER_TOKEN`` plus ``MESSAGE_OVERHEAD`` (a
message's framing). The estimate of a whole request is calibrated by the provider's own count
when there is one: the last completed call's reported input tokens plus the rows added since,
each scaled by the ratio of that count to this module's count of the same request.
Pure: values in, numbers out."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from agentops.estimate import (
    CHARS_PER_TOKEN,
    MAX_RATIO,
    MESSAGE_OVERHEAD,
    MIN_RATIO,
    row_tokens,
    text_tokens,
)
from agentops.estimate import (
    ratio as provider_ratio,
)

__all__ = [
    "CHARS_PER_TOKEN",
    "MAX_RATIO",
    "MESSAGE_OVERHEAD",
    "MIN_RATIO",
    "EstimatedRow",
    "LastCall",
    "fixed_tokens",
    "request_estimate",
    "row_tokens",
    "target_tokens",
    "text_tokens",
]


def fixed_tokens(system: str, tools: Sequence[Any]) -> int:
    """The tokens every request carries whatever its history: the system prompt and the tools."""
    return (text_tokens(system) + MESSAGE_OVERHEAD if system else 0) + (
        text_tokens(list(tools)) if tools else 0
    )


@dataclass(frozen=True)
class LastCall:
    """The provider's count of the last completed call: its input tokens, when it was sent, our
    count of what it carried, and whether anything was set aside since it was sent."""

    input_tokens: int
    sent_at: datetime
    counted: int
    moved_since: bool = False

    @property
    def ratio(self) -> float:
        """The provider's tokens per token of ours."""
        return provider_ratio(reported=self.input_tokens, counted=self.counted)


@dataclass(frozen=True)
class EstimatedRow:
    """What the estimate reads of a presented row."""

    tokens: int
    created_at: datetime


def request_estimate(
    *,
    fixed: int,
    rows: Iterable[EstimatedRow],
    last: LastCall | None,
) -> int:
    """The request's input tokens. With ``last``, the provider's count plus the rows added after
    it was sent, scaled by its ratio (or, when rows were set aside since, everything scaled by
    it); without, ``fixed`` plus every row's estimate."""
    rows = list(rows)
    if last is None:
        return fixed + sum(r.tokens for r in rows)
    if last.moved_since:
        return round((fixed + sum(r.tokens for r in rows)) * last.ratio)
    since = sum(r.tokens for r in rows if r.created_at > last.sent_at)
    return last.input_tokens + round(since * last.ratio)


def target_tokens(*, window: int, reserve: int, margin_percent: int) -> int:
    """The input a request may hold after an act: the window less its margin, less the answer's
    reserve (never below 0)."""
    return max(window * (100 - margin_percent) // 100 - reserve, 0)
