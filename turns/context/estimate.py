"""How many tokens a request holds, without a tokenizer (architecture.md §5.9, "The estimate").

No tokenizer is downloaded at run time (a machine without internet could not fetch one), so a
row counts as its JSON's characters over ``CHARS_PER_TOKEN`` plus ``MESSAGE_OVERHEAD`` (a
message's framing). The estimate of a whole request is calibrated by the provider's own count
when there is one: the last completed call's reported input tokens plus the rows added since,
each scaled by the ratio of that count to this module's count of the same request.
Pure: values in, numbers out."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

# English prose and JSON run at about four characters a token in the BPE tokenizers providers
# use; code and non-Latin text run denser, which the margin and the refusal path absorb.
CHARS_PER_TOKEN: Final = 4
MESSAGE_OVERHEAD: Final = 4


def text_tokens(value: Any) -> int:
    """A value's tokens: its JSON's characters over ``CHARS_PER_TOKEN``, rounded up."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return -(-len(text) // CHARS_PER_TOKEN)


def row_tokens(content: Any) -> int:
    """One history row's tokens as a message of the request."""
    return text_tokens(content) + MESSAGE_OVERHEAD


def fixed_tokens(system: str, tools: Sequence[Any]) -> int:
    """The tokens every request carries whatever its history: the system prompt and the tools."""
    return (text_tokens(system) + MESSAGE_OVERHEAD if system else 0) + (
        text_tokens(list(tools)) if tools else 0
    )


# The calibration is bounded: a count far off ours is more likely a provider's quirk (cached or
# image tokens) than the text's density.
MIN_RATIO: Final = 0.25
MAX_RATIO: Final = 4.0


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
        if self.counted <= 0:
            return 1.0
        return min(max(self.input_tokens / self.counted, MIN_RATIO), MAX_RATIO)


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
