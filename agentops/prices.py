"""Prices and what a call costs (architecture.md §17).

``call_cost`` is pure: a call's usage, whether the provider answered, and the price in force at
its send give its cost, exact in ``Decimal``. ``price_in_force`` finds that price through the
process's ``PriceBook`` (a part of its runtime, ``calls.engine``): each (provider, model)'s
prices, read again once ``PRICE_CACHE_S`` old, so ending a call costs no extra round trip to the
database in the common case.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation, localcontext
from enum import StrEnum
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from agentops.exceptions import Conflict, bad_field
from agentops.models import Price, Provider

# How old a process's copy of a model's prices may be: a price posted is used by every process
# within this, so a cutover is exact when its effective_from is at least this far ahead.
PRICE_CACHE_S = 5.0
PRICE_PLACES = Price._meta.get_field("input_per_mtok").decimal_places or 6
_PRICE_DIGITS = Price._meta.get_field("input_per_mtok").max_digits or 18
PRICE_MAX = Decimal(10) ** (_PRICE_DIGITS - PRICE_PLACES)
MTOK = 1_000_000
PRICE_FIELDS = (
    "input_per_mtok",
    "output_per_mtok",
    "cached_input_per_mtok",
    "cache_write_per_mtok",
    "reasoning_per_mtok",
)


class Basis(StrEnum):
    """How a call's cost was reached (``InferenceCall.cost_basis``)."""

    PRICED = "priced"  # usage x the price in force at send
    UNPRICED = "unpriced"  # usage, but no price in force for its provider and model: null
    UNREPORTED = "usage unreported"  # the provider answered but reported no usage: null
    NOTHING_USED = "nothing used"  # ended before the provider answered anything: 0


@dataclass(frozen=True)
class Terms:
    """A price row's figures, as the cost needs them."""

    id: int
    input: Decimal
    output: Decimal
    cached_input: Decimal | None
    reasoning: Decimal | None
    currency: str
    effective_from: datetime
    cache_write: Decimal | None = None


@dataclass(frozen=True)
class Cost:
    amount: Decimal | None
    price_id: int | None
    basis: Basis

    def fields(self) -> dict[str, Any]:
        return {"cost": self.amount, "price_id": self.price_id, "cost_basis": self.basis.value}


def call_cost(
    *,
    input_tokens: int | None,
    output_tokens: int | None,
    reasoning_tokens: int | None,
    cached_input_tokens: int | None,
    answered: bool,
    terms: Terms | None,
    cache_write_tokens: int | None = None,
) -> Cost:
    """The cost of a call. Input counts cached input and cache writes, and output counts
    reasoning (as recorded, calls.adapters), so each part is billed once at its own price:
    cached input at the cached price and cache writes at the cache-write price (the input price
    when none is set), reasoning at the reasoning price (else output).
    A call with no usage costs 0 when the provider answered nothing (``answered`` false), else
    it is unknown (None): a model that answered was paid for, whatever it reported."""
    if input_tokens is None and output_tokens is None:
        if not answered:
            return Cost(Decimal(0), None, Basis.NOTHING_USED)
        return Cost(None, None, Basis.UNREPORTED)
    if terms is None:
        return Cost(None, None, Basis.UNPRICED)
    given = input_tokens or 0
    cached = min(cached_input_tokens or 0, given)
    written = min(cache_write_tokens or 0, given - cached)
    out = output_tokens or 0
    reasoning = min(reasoning_tokens or 0, out)
    # Token counts reach 2^63 and prices 18 digits: enough precision that nothing is rounded.
    with localcontext() as ctx:
        ctx.prec = 60
        total = (
            (given - cached - written) * terms.input
            + cached * (terms.cached_input if terms.cached_input is not None else terms.input)
            + written * (terms.cache_write if terms.cache_write is not None else terms.input)
            + (out - reasoning) * terms.output
            + reasoning * (terms.reasoning if terms.reasoning is not None else terms.output)
        )
        return Cost(total.scaleb(-6), terms.id, Basis.PRICED)


def _terms(p: Price) -> Terms:
    return Terms(
        id=p.pk,
        input=p.input_per_mtok,
        output=p.output_per_mtok,
        cached_input=p.cached_input_per_mtok,
        reasoning=p.reasoning_per_mtok,
        cache_write=p.cache_write_per_mtok,
        currency=p.currency,
        effective_from=p.effective_from,
    )


class PriceBook:
    """The process's copy of the prices it has used, per (provider id, model), each read again
    once ``PRICE_CACHE_S`` old (a part of the runtime: any thread may ask)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: dict[tuple[int, str], tuple[float, tuple[Terms, ...]]] = {}

    def in_force(self, *, provider_id: int, model: str, at: datetime) -> Terms | None:
        key = (provider_id, model)
        now = time.monotonic()
        with self._lock:
            kept = self._read.get(key)
        if kept is None or now - kept[0] > PRICE_CACHE_S:
            rows = Price.objects.filter(provider_id=provider_id, model=model).order_by(
                "-effective_from"
            )
            kept = (now, tuple(_terms(p) for p in rows))
            with self._lock:
                self._read[key] = kept
        return next((t for t in kept[1] if t.effective_from <= at), None)

    def forget(self) -> None:
        with self._lock:
            self._read.clear()

    async def stop(self) -> None:
        return None


def price_in_force(
    prices: PriceBook, *, provider_id: int | None, model: str, at: datetime
) -> Terms | None:
    """The price of ``model`` on the provider in force at ``at`` (None: none is), through the
    process's copy ``prices``."""
    if provider_id is None:
        return None
    return prices.in_force(provider_id=provider_id, model=model, at=at)


def decimal_amount(field: str, value: Any, *, example: str = "3.00") -> Decimal:
    """An amount from the API (a price, a budget): a decimal string or a number, finite; else a
    400 naming ``field``."""
    if value is None:
        raise bad_field(field, "is required")
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise bad_field(field, f'must be a decimal string or a number (e.g. "{example}")')
    if isinstance(value, float) and not math.isfinite(value):
        raise bad_field(field, "must be a finite amount")
    try:
        # A float goes through its shortest repr: 0.1 is "0.1", not its binary expansion.
        amount = Decimal(repr(value) if isinstance(value, float) else str(value).strip())
    except InvalidOperation:
        raise bad_field(field, f"{str(value)[:50]!r} is not a decimal amount") from None
    if not amount.is_finite():
        raise bad_field(field, "must be a finite amount")
    return amount


def price_amount(field: str, value: Any, *, required: bool) -> Decimal | None:
    """A price figure from the API: ``decimal_amount``, not negative, at most
    ``PRICE_PLACES`` decimal places; else a 400 naming ``field``."""
    if value is None and not required:
        return None
    amount = decimal_amount(field, value)
    if amount < 0:
        raise bad_field(field, "must not be negative")
    if amount >= PRICE_MAX:
        raise bad_field(field, f"must be less than {PRICE_MAX} per million tokens")
    exponent = amount.as_tuple().exponent
    if isinstance(exponent, int) and exponent < -PRICE_PLACES:
        raise bad_field(field, f"must have at most {PRICE_PLACES} decimal places")
    return amount


def price_create(
    prices: PriceBook,
    *,
    provider: str,
    model: str,
    amounts: dict[str, Decimal | None],
    currency: str,
    effective_from: datetime | None,
) -> Price:
    """A new price for (provider, model) from ``effective_from`` (now when None). The prices
    before it stay: the calls sent while they were in force keep their cost. ``prices``, the
    process's copy, forgets what it read at once (the other processes' within the bound)."""
    found = Provider.objects.filter(name=provider).first()
    if found is None:
        raise bad_field("provider", f"no provider named {provider!r}")
    try:
        with transaction.atomic():
            price = Price.objects.create(
                provider=found,
                model=model,
                currency=currency,
                effective_from=effective_from or _now_in_ms(),
                **amounts,
            )
    except IntegrityError:
        raise Conflict(
            f"{model!r} on {provider!r} already has a price from that instant",
            data={"field": "effective_from"},
        ) from None
    prices.forget()
    return price


def _now_in_ms() -> datetime:
    # The API writes instants in whole ms: a default kept so reads back as it is stored.
    now = timezone.now()
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def price_out(p: Price) -> dict[str, Any]:
    return {
        "id": p.pk,
        "provider": p.provider.name,
        "model": p.model,
        **{f: decimal_text(getattr(p, f)) for f in PRICE_FIELDS},
        "currency": p.currency,
        "effective_from": p.effective_from,
        "created_at": p.created_at,
    }


def decimal_text(amount: Decimal | None) -> str | None:
    """An amount as the API writes it: a plain decimal string without trailing zeros
    ("0.0042", "12", "0"), never an exponent; None stays None (unpriced, not 0)."""
    if amount is None:
        return None
    text = format(amount, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text or "0"
