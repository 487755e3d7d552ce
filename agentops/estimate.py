"""How many tokens a text holds, without a tokenizer (architecture.md §5.9, "The estimate"): the
one count both the model's window (turns.context) and budgets (calls.budgeting) use.

No tokenizer is downloaded at run time (a machine without internet could not fetch one), so a
value counts as its JSON's characters over ``CHARS_PER_TOKEN``, plus ``MESSAGE_OVERHEAD`` for a
message's framing; the provider's own count of an earlier request calibrates it (``ratio``).
Pure: values in, numbers out."""

from __future__ import annotations

import json
from typing import Any, Final

# English prose and JSON run at about four characters a token in the BPE tokenizers providers
# use; code and non-Latin text run denser, which the calibration, the margins and the refusal
# path absorb.
CHARS_PER_TOKEN: Final = 4
MESSAGE_OVERHEAD: Final = 4

# The calibration is bounded: a count far off ours is more likely a provider's quirk (cached or
# image tokens) than the text's density.
MIN_RATIO: Final = 0.25
MAX_RATIO: Final = 4.0


def text_tokens(value: Any) -> int:
    """A value's tokens: its JSON's characters over ``CHARS_PER_TOKEN``, rounded up."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return -(-len(text) // CHARS_PER_TOKEN)


def row_tokens(content: Any) -> int:
    """One message's tokens as part of a request."""
    return text_tokens(content) + MESSAGE_OVERHEAD


def ratio(*, reported: int, counted: int) -> float:
    """The provider's tokens per token of ours, from its count of a request we counted
    ``counted``, bounded to [MIN_RATIO, MAX_RATIO] (1 when we counted nothing)."""
    if counted <= 0:
        return 1.0
    return min(max(reported / counted, MIN_RATIO), MAX_RATIO)
