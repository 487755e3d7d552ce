"""What the calls cost, read back (API.md ``GET /spend``, the metrics' ``agentops_spend_total``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from django.db.models import Count, Q, Sum
from django.db.models.functions import Coalesce

from agentops.models import ApiToken, Price
from agentops.prices import decimal_text
from inference.models import InferenceCall

GroupBy = Literal["agent", "project", "model"]
_KEYS: dict[str, str] = {
    "agent": "agent__name",
    "project": "agent__project__name",
    "model": "model",
}


def spend_currency() -> str:
    """The currency every price is in (one for all: ``POST /prices`` keeps it so)."""
    return Price.objects.values_list("currency", flat=True).first() or "USD"


def spend_out(
    *, token: ApiToken, group_by: GroupBy, since: datetime | None, until: datetime | None
) -> dict[str, Any]:
    """The ended calls the token may see (a project token: its project's agents), by the call's
    end in [since, until), grouped. ``cost`` sums the calls that have one; ``unpriced_calls``
    counts those that have none, and a group with no cost at all is null, never 0."""
    calls = InferenceCall.objects.filter(outcome__isnull=False)
    if not token.operator:
        calls = calls.filter(agent__project_id=token.project_id)
    if since is not None:
        calls = calls.filter(ended_at__gte=since)
    if until is not None:
        calls = calls.filter(ended_at__lt=until)
    rows = (
        calls.values(_KEYS[group_by])
        .annotate(
            spent=Sum("cost"),
            n=Count("id"),
            unpriced=Count("id", filter=Q(cost__isnull=True)),
            inp=Coalesce(Sum("input_tokens"), 0),
            out=Coalesce(Sum("output_tokens"), 0),
        )
        .order_by(_KEYS[group_by])
    )
    items = [
        {
            "key": r[_KEYS[group_by]],
            "cost": decimal_text(r["spent"]),
            "calls": r["n"],
            "unpriced_calls": r["unpriced"],
            "input_tokens": r["inp"],
            "output_tokens": r["out"],
        }
        for r in rows
    ]
    return {"items": items, "currency": spend_currency()}
