"""Writing a call's timeline to its InferenceCall row, once the call has ended.

Every call made keeps its row: a result the database refuses to store for what it holds (not
for being down) is stored without the refused parts, with an error saying so
(``unstorable_fields``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

from django.db import DataError, IntegrityError, connection, transaction
from django.utils import timezone

from agentops.prices import PriceBook, call_cost, price_in_force
from agentops.text import bound_text
from calls.bounds import BoundsSettings
from calls.client import CallResult, Timeline
from calls.config import bounds_settings
from calls.types import ProviderError
from inference.models import InferenceCall


def ms_to_dt(ms: float | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def _offsets(marks: Iterable[float], sent: float) -> list[int]:
    return [round(m - sent) for m in marks]


def call_marks(t: Timeline, bounds: BoundsSettings | None) -> dict[str, Any]:
    """The call's recorded picture (``InferenceCall.marks``): when the model events and the
    keepalives arrived, in whole ms after send, the first and the last ones of each with the
    count left out between them, and the bounds the call ran under (None: bounds off)."""
    # The headers count as a keepalive in the counter (they prove the connection lives) but
    # have their own instant, not a mark.
    keepalives = t.keepalives - (1 if t.headers is not None else 0)
    return {
        "events": _offsets(t.event_marks, t.sent),
        "events_tail": _offsets(t.event_tail, t.sent),
        "events_omitted": max(0, t.model_events - len(t.event_marks) - len(t.event_tail)),
        "keepalives": _offsets(t.keepalive_marks, t.sent),
        "keepalives_tail": _offsets(t.keepalive_tail, t.sent),
        "keepalives_omitted": max(0, keepalives - len(t.keepalive_marks) - len(t.keepalive_tail)),
        "bounds": dataclasses.asdict(bounds) if bounds is not None else None,
    }


def call_fields(result: CallResult) -> dict[str, Any]:
    """What a call's row records of its result: the timeline, the outcome, the usage."""
    t = result.timeline
    return {
        "sent_at": ms_to_dt(t.sent),
        "headers_at": ms_to_dt(t.headers),
        "first_event_at": ms_to_dt(t.first_event),
        "first_content_at": ms_to_dt(t.first_content),
        "thinking_started_at": ms_to_dt(t.thinking_start),
        "last_event_at": ms_to_dt(t.last_event),
        "ended_at": ms_to_dt(t.ended),
        "model_events": t.model_events,
        "keepalives": t.keepalives,
        "outcome": result.outcome,
        "stop_reason": _stop_reason(result),
        "bound": result.bound.value if result.bound else None,
        "bound_deadline": ms_to_dt(result.bound_deadline),
        "cut_lateness_ms": result.lateness_ms,
        "error": result.error.as_dict() if result.error else None,
        # Every caller runs the call under bounds_settings(): the bounds as they stood.
        "marks": call_marks(t, bounds_settings()),
        **result.usage.as_dict(),
    }


def call_cost_fields(
    prices: PriceBook, *, provider_id: int | None, model: str, fields: dict[str, Any]
) -> dict[str, Any]:
    """The cost a call's row records with ``fields`` (``cost``, ``price_id``, ``cost_basis``):
    its usage at the price of the provider and model that served it, in force when it was
    sent (architecture.md §17). The provider answered when the call completed or any model
    event arrived; a call that ended before either, with no usage, cost nothing."""
    at = fields.get("sent_at") or fields.get("ended_at") or timezone.now()
    answered = fields.get("outcome") == "completed" or bool(fields.get("model_events"))
    usage = {k: fields.get(k) for k in USAGE_FIELDS}
    priced = usage["input_tokens"] is not None or usage["output_tokens"] is not None
    terms = price_in_force(prices, provider_id=provider_id, model=model, at=at) if priced else None
    cost = call_cost(**usage, answered=answered, terms=terms)
    if cost.amount is not None and cost.amount >= COST_LIMIT:
        # Past what the column holds (absurd counts): unknown, rather than the row's usage lost.
        return {"cost": None, "price_id": cost.price_id, "cost_basis": "out of range"}
    return cost.fields()


_COST = InferenceCall._meta.get_field("cost")
COST_LIMIT = Decimal(10) ** ((_COST.max_digits or 30) - (_COST.decimal_places or 12))


USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
)


def _stop_reason(result: CallResult) -> str:
    # The provider's word, as the column holds it.
    reason = result.output.stop_reason if result.output else ""
    return str(reason)[:STOP_REASON_LIMIT] if reason else ""


STOP_REASON_LIMIT = InferenceCall._meta.get_field("stop_reason").max_length or 50
# A write the database refuses for what it holds (a value out of a column's range, a row that
# breaks a constraint), or that cannot be encoded: trying it again gives the same answer.
# (Not OperationalError or InterfaceError: those say the database did not answer.)
UNSTORABLE = (DataError, IntegrityError, ValueError, TypeError)

T = TypeVar("T")


def unstorable_fields(result: CallResult, exc: BaseException) -> dict[str, Any]:
    """What a call's row records when its result could not be stored: the timeline and the
    outcome, and an error naming why (the usage, the stop reason and the picture left out)."""
    why = (
        f"the call's record could not be stored ({type(exc).__name__}: {exc}); "
        "its usage and details are not kept"
    )
    was = result.error or ProviderError(type="unknown", message="")
    error = dataclasses.replace(
        was,
        provider_code="unrecorded",
        message=bound_text(f"{why}. {was.message}" if was.message else why),
    )
    return {
        **call_fields(result),
        "stop_reason": "",
        "marks": {},
        "error": error.as_dict(),
        "input_tokens": None,
        "output_tokens": None,
        "reasoning_tokens": None,
        "cached_input_tokens": None,
        "cache_write_tokens": None,
    }


def stored(write: Callable[[dict[str, Any]], T], result: CallResult) -> T:
    """``write(fields)`` with the call's fields or, when the database refuses them for what
    they hold, with ``unstorable_fields`` (in a savepoint inside a transaction, so it can go on)."""
    fields = call_fields(result)
    try:
        if not connection.in_atomic_block:
            return write(fields)
        with transaction.atomic():
            return write(fields)
    except UNSTORABLE as exc:
        return write(unstorable_fields(result, exc))
