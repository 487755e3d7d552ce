"""What the calls cost, read back: API.md ``GET /spend``, the admin's spend page of a project and
the dashboard's spend of today, and the admin's spend of all projects. One query shape for all
(``spend_items``): the ended calls
in ``[since, until)`` on ``ended_at``, grouped; a day is the local date of the call's end in
``AGENTOPS_BUDGET_TIME_ZONE``, the zone the budgets' periods follow. The rows a page sums are read back one by one, for its CSV, by
``spend_rows`` over the same calls."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Literal
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db.models import Count, F, Q, QuerySet, Sum
from django.db.models.functions import Coalesce, TruncDate

from agentops.models import Agent, ApiToken, Budget, Price, Project
from agentops.prices import decimal_text
from inference.models import InferenceCall

GroupBy = Literal["agent", "project", "model", "day"]
_KEYS: dict[str, str] = {
    "agent": "agent__name",
    "project": "agent__project__name",
    "model": "model",
    "day": "day",
}
DAYS_MAX = 366


def spend_currency() -> str:
    """The currency every price is in (one for all: ``POST /prices`` keeps it so)."""
    return Price.objects.values_list("currency", flat=True).first() or "USD"


def spend_zone() -> ZoneInfo:
    """The zone a day of spend is cut in: the budgets' (``AGENTOPS_BUDGET_TIME_ZONE``)."""
    return ZoneInfo(settings.AGENTOPS_BUDGET_TIME_ZONE)


def local_day_start(day: date, zone: ZoneInfo) -> datetime:
    """The instant ``day`` starts in ``zone`` (its local midnight; a DST day is 23 or 25 h)."""
    return datetime.combine(day, time(), tzinfo=zone)


def spend_calls(
    *, project_id: int | None, since: datetime | None, until: datetime | None
) -> QuerySet[InferenceCall]:
    """The ended calls of one project's agents (``project_id``; None: every project's) whose
    end is in ``[since, until)`` (either bound may be open)."""
    calls = InferenceCall.objects.filter(outcome__isnull=False)
    if project_id is not None:
        calls = calls.filter(agent__project_id=project_id)
    if since is not None:
        calls = calls.filter(ended_at__gte=since)
    if until is not None:
        calls = calls.filter(ended_at__lt=until)
    return calls


def spend_items(calls: QuerySet[InferenceCall], *, group_by: GroupBy) -> list[dict[str, Any]]:
    """``calls`` grouped by ``group_by`` in one query, ordered by key: ``cost`` sums the calls
    that have one and is null when none has (never 0: unknown is not free); ``unpriced_calls``
    counts the calls without a cost. A day's key is its local date, ``YYYY-MM-DD``."""
    key = _KEYS[group_by]
    if group_by == "day":
        calls = calls.filter(ended_at__isnull=False).annotate(
            day=TruncDate("ended_at", tzinfo=spend_zone())
        )
    rows = (
        calls.values(key)
        .annotate(
            spent=Sum("cost"),
            n=Count("id"),
            unpriced=Count("id", filter=Q(cost__isnull=True)),
            inp=Coalesce(Sum("input_tokens"), 0),
            out=Coalesce(Sum("output_tokens"), 0),
        )
        .order_by(key)
    )
    return [
        {
            "key": r[key].isoformat() if group_by == "day" else r[key],
            "cost": decimal_text(r["spent"]),
            "calls": r["n"],
            "unpriced_calls": r["unpriced"],
            "input_tokens": r["inp"],
            "output_tokens": r["out"],
        }
        for r in rows
    ]


def spent_since(owner: Agent | Project, start: datetime) -> Decimal:
    """What the owner's calls (an agent's, or every agent's of a project) that ended since
    ``start`` cost: a budget's ledger starts from it (agentops.budget_api.budget_put)."""
    calls = InferenceCall.objects.filter(ended_at__gte=start, cost__isnull=False)
    mine = (
        calls.filter(agent=owner)
        if isinstance(owner, Agent)
        else calls.filter(agent__project=owner)
    )
    total = mine.aggregate(total=Sum("cost"))["total"]
    return total if total is not None else Decimal(0)


def spend_out(
    *, token: ApiToken, group_by: GroupBy, since: datetime | None, until: datetime | None
) -> dict[str, Any]:
    """``GET /spend``: the ended calls the token may see (a project token: its project's
    agents), by the call's end in [since, until), grouped."""
    calls = spend_calls(
        project_id=None if token.operator else token.project_id, since=since, until=until
    )
    return {"items": spend_items(calls, group_by=group_by), "currency": spend_currency()}


def empty_item(key: str) -> dict[str, Any]:
    return {
        "key": key,
        "cost": None,
        "calls": 0,
        "unpriced_calls": 0,
        "input_tokens": 0,
        "output_tokens": 0,
    }


def spend_total(items: list[dict[str, Any]], *, key: str = "total") -> dict[str, Any]:
    """The items summed as one: ``cost`` null when no item has one."""
    costs = [Decimal(i["cost"]) for i in items if i["cost"] is not None]
    total = empty_item(key)
    total["cost"] = decimal_text(sum(costs, Decimal(0))) if costs else None
    for field in ("calls", "unpriced_calls", "input_tokens", "output_tokens"):
        total[field] = sum(i[field] for i in items)
    return total


@dataclass(frozen=True)
class SpendPeriod:
    """The last ``len(days)`` local days up to today (oldest first), and the instants they
    span: ``[since, until)``."""

    days: list[date]
    since: datetime
    until: datetime


def spend_period(*, days: int, now: datetime) -> SpendPeriod:
    """The ``days`` local days ending with today's (``now``'s local date), in the spend zone."""
    zone = spend_zone()
    today = now.astimezone(zone).date()
    listed = [today - timedelta(days=n) for n in range(days - 1, -1, -1)]
    return SpendPeriod(
        days=listed,
        since=local_day_start(listed[0], zone),
        until=local_day_start(today + timedelta(days=1), zone),
    )


def check_days(value: str | None, *, default: int = 30) -> int:
    """``?days=N`` of the spend page: a whole number from 1 to 366 (absent: ``default``).
    Raises ValueError with a message for people."""
    if value is None or value == "":
        return default
    text = value.strip()
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= DAYS_MAX:
        raise ValueError(f"days must be a whole number from 1 to {DAYS_MAX}, not {value[:40]!r}")
    return int(text)


def _period_spend(
    *, project_id: int | None, days: int, now: datetime
) -> tuple[Any, dict[str, Any]]:
    """The calls of a page's period (``project_id`` None: every project's) and what both spend
    pages show of it: each day (oldest first; a day without calls is there, empty), the total,
    the period's bounds, zone and currency. One grouped query."""
    period = spend_period(days=days, now=now)
    calls = spend_calls(project_id=project_id, since=period.since, until=period.until)
    by_day = {i["key"]: i for i in spend_items(calls, group_by="day")}
    each_day = [by_day.get(d.isoformat()) or empty_item(d.isoformat()) for d in period.days]
    return calls, {
        "days": each_day,
        "total": spend_total(each_day),
        "first_day": period.days[0].isoformat(),
        "last_day": period.days[-1].isoformat(),
        "since": period.since,
        "until": period.until,
        "zone": settings.AGENTOPS_BUDGET_TIME_ZONE,
        "currency": spend_currency(),
    }


def project_spend(*, project_id: int, days: int, now: datetime) -> dict[str, Any]:
    """A project's spend over its last ``days`` local days (the admin's spend page): each day,
    the period by agent and by model, and the period's total. Three grouped queries over the
    same calls."""
    calls, shown = _period_spend(project_id=project_id, days=days, now=now)
    return {
        **shown,
        "by_agent": spend_items(calls, group_by="agent"),
        "by_model": spend_items(calls, group_by="model"),
    }


def all_projects_spend(*, days: int, now: datetime) -> dict[str, Any]:
    """Every project's spend over the last ``days`` local days (the admin's spend of all
    projects): each project by name (one without calls is there, empty), each day over all
    of them (oldest first), and the period's total. Three queries whatever the number of
    projects and agents: two grouped, one of the projects' names."""
    calls, shown = _period_spend(project_id=None, days=days, now=now)
    spent = {i["key"]: i for i in spend_items(calls, group_by="project")}
    projects = [
        {**(spent.get(name) or empty_item(name)), "project_id": pk}
        for pk, name in Project.objects.order_by("name").values_list("pk", "name")
    ]
    return {**shown, "projects": projects}


def every_budget() -> list[Budget]:
    """Every budget, agents' and projects', with its owner (and an agent's project) in one
    query, grouped by project: a project's own budget first, then its agents' by name."""
    return list(
        Budget.objects.select_related("agent__project", "project").order_by(
            Coalesce("project__name", "agent__project__name"),
            F("agent__name").asc(nulls_first=True),
        )
    )


CSV_HEADER = (
    "id",
    "ended_at",
    "project",
    "agent",
    "provider",
    "model",
    "outcome",
    "input_tokens",
    "output_tokens",
    "cost",
    "currency",
)
# A spreadsheet reads a cell that starts with one of these as a formula.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(text: str | None) -> str:
    if text is None:
        return ""
    return f"'{text}" if text.startswith(_FORMULA_START) else text


def spend_rows(calls: QuerySet[InferenceCall]) -> Iterator[tuple[object, ...]]:
    """One row per call of ``calls`` (``CSV_HEADER``'s columns), by end then id, read from a
    server-side cursor a chunk at a time (a month of a busy service does not fit in memory):
    ``ended_at`` in the spend zone with its offset, ``cost`` as the API writes it and empty
    when unpriced (never 0), the currency on every row. Names that a spreadsheet would run as
    a formula are quoted with a leading apostrophe."""
    zone, currency = spend_zone(), spend_currency()
    rows = calls.order_by("ended_at", "id").values_list(
        "id",
        "ended_at",
        "agent__project__name",
        "agent__name",
        "provider__name",
        "model",
        "outcome",
        "input_tokens",
        "output_tokens",
        "cost",
    )
    for pk, ended_at, project, agent, provider, model, outcome, inp, out, cost in rows.iterator(
        chunk_size=2000
    ):
        yield (
            pk,
            ended_at.astimezone(zone).isoformat() if ended_at is not None else "",
            _cell(project),
            _cell(agent),
            _cell(provider),
            _cell(model),
            outcome,
            "" if inp is None else inp,
            "" if out is None else out,
            decimal_text(cost) or "",
            currency,
        )


def spend_today_by_agent(*, now: datetime) -> tuple[str, dict[str, dict[str, Any]]]:
    """Today's local date and, for each agent with a call ended today, its spend (one grouped
    query for every agent: the dashboard's snapshot)."""
    period = spend_period(days=1, now=now)
    calls = spend_calls(project_id=None, since=period.since, until=period.until)
    return period.days[0].isoformat(), {i["key"]: i for i in spend_items(calls, group_by="agent")}
