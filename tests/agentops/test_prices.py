"""Which price a call is costed at (``agentops.prices``, architecture.md §17): the row of its
provider and model in force when it was sent, each part of its usage at that row's own price.
The prices' endpoints and every endpoint's costed calls are in test_spend.py. Each lookup goes
through a fresh copy (``PriceBook``), so nothing one read kept answers the next."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from agentops.prices import PriceBook, call_cost, price_in_force
from tests.factories import PriceFactory, ProviderFactory

pytestmark = pytest.mark.django_db


def test_a_call_is_priced_by_the_row_in_force_when_it_was_sent() -> None:
    first = PriceFactory.create()
    second = PriceFactory.create(
        provider=first.provider,
        later=True,
        input_per_mtok=Decimal("6"),
        output_per_mtok=Decimal("30"),
    )

    def in_force(at: datetime) -> int | None:
        terms = price_in_force(PriceBook(), provider_id=first.provider_id, model="answer", at=at)
        return None if terms is None else terms.id

    assert in_force(first.effective_from - timedelta(milliseconds=1)) is None  # unpriced then
    assert in_force(first.effective_from) == first.pk
    assert in_force(second.effective_from - timedelta(milliseconds=1)) == first.pk
    assert in_force(second.effective_from) == second.pk


def test_a_price_is_of_its_provider_and_model_alone() -> None:
    price = PriceFactory.create(model="answer")
    now = timezone.now()
    assert (
        price_in_force(PriceBook(), provider_id=price.provider_id, model="answer", at=now)
        is not None
    )
    assert (
        price_in_force(PriceBook(), provider_id=price.provider_id, model="answer-2", at=now) is None
    )
    other = ProviderFactory.create()
    assert price_in_force(PriceBook(), provider_id=other.pk, model="answer", at=now) is None


def test_cached_input_and_reasoning_are_billed_at_the_rows_own_prices() -> None:
    price = PriceFactory.create(cached=True)  # 3 in, 0.3 cached, 15 out, 12.5 reasoning
    terms = price_in_force(
        PriceBook(), provider_id=price.provider_id, model="answer", at=timezone.now()
    )
    cost = call_cost(
        input_tokens=1_000_000,
        cached_input_tokens=400_000,
        output_tokens=1_000_000,
        reasoning_tokens=500_000,
        answered=True,
        terms=terms,
    )
    # 600,000 x 3 + 400,000 x 0.3 + 500,000 x 15 + 500,000 x 12.5, per million.
    assert (cost.amount, cost.price_id) == (Decimal("15.67"), price.pk)
