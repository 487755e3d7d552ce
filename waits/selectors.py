"""Reads of provider waits for the API, the admin and the dashboard (API.md, Waits)."""

from __future__ import annotations

import math
from typing import Any

from agentops.budgets import budget_holds
from agentops.models import Agent

from .core import EVERY_AGENT, EVERY_MODEL, MAX_INSTANT_MS, Wait, wait_binds
from .journal import entry_problem, journal_binding, ms_to_datetime
from .models import WaitJournalEntry


def _lists(wait: Wait, *, agent: str | None, model: str | None, own: str | None) -> bool:
    """Whether ``wait`` is listed for the filter: a scoped one for an agent on its provider,
    one on every model for any model."""
    scoped = wait.agent == EVERY_AGENT
    if agent is not None and (wait.provider != own if scoped else wait.agent != agent):
        return False
    if model is None:
        return True
    return wait.model in (model, EVERY_MODEL) if scoped or wait.ref else wait.model == model


def wait_listed(wait: Wait) -> dict[str, Any]:
    """A wait as ``GET /waits`` lists it (API.md)."""
    return {
        "agent": wait.agent,
        "model": wait.model,
        # The provider it binds on; null: the agent's own (§6.11). A scoped wait's always.
        "provider": wait.provider or None,
        "scope": wait.scope,
        "id": wait.ref or None,
        "until": ms_to_datetime(wait.until) if wait.until is not None else None,
        "reason": wait.reason,
        "set_at": ms_to_datetime(wait.set_at),
        "source": "operator" if wait.ref else wait.source,
    }


def binding_waits(
    *, agent: str | None = None, model: str | None = None, now_ms: float, fresh: bool = True
) -> tuple[bool, list[dict[str, Any]]]:
    """(journal_readable, the waits that bind at ``now_ms``), optionally for one agent and
    model, as ``{agent, model, until, reason, set_at, source}`` sorted by agent and model.

    While the records are unreadable every agent that is not disposed or ephemeral is listed
    as held on model ``*`` (``source: "unreadable"``), except what a release made certain.

    A person reads these (``fresh``): rows other processes appended are read first, whatever
    the poll cadence, so a turn another process reports ``held`` has its wait listed here. A
    periodic reader (the metrics scrape) passes ``fresh=False`` and keeps the cadence."""
    book = journal_binding(now_ms=now_ms, fresh=fresh)
    # A scoped wait (§6.12) binds every agent on its provider: listed for one agent when it
    # binds that agent's provider.
    own = (
        Agent.objects.filter(name=agent).values_list("provider__name", flat=True).first()
        if agent is not None and book.scoped_known
        else None
    )
    binding = [
        *book.binding(now_ms),
        *(h for h in book.holds.values() if wait_binds(h.until, now_ms)),
    ]
    waits = [wait_listed(w) for w in binding if _lists(w, agent=agent, model=model, own=own)]
    if book.unreadable is not None:
        cause = book.unreadable
        agents = Agent.objects.filter(disposed_at__isnull=True).exclude(kind=Agent.Kind.EPHEMERAL)
        if agent is not None:
            agents = agents.filter(name=agent)
        for name in agents.values_list("name", flat=True):
            if name in book.known_agents or (
                model is not None and (name, model) in book.known_pairs
            ):
                continue
            waits.append(
                {
                    "agent": name,
                    "model": EVERY_MODEL,
                    "provider": None,
                    "until": None,
                    "reason": f"the provider-waits journal cannot be read ({cause.describe()})",
                    "set_at": None,
                    "source": "unreadable",
                }
            )
    # Spent budgets hold every model of their agents beside the journal (§18.3).
    for held in budget_holds(now=ms_to_datetime(math.floor(now_ms))):
        if (agent is None or held.agent == agent) and (model is None or model == EVERY_MODEL):
            waits.append(
                {
                    "agent": held.agent,
                    "model": EVERY_MODEL,
                    "provider": None,
                    "until": held.until,
                    "reason": held.reason,
                    "set_at": held.set_at,
                    "source": "recorded",
                }
            )
    waits.sort(key=lambda w: (w["agent"], w["model"], w["provider"] or ""))
    return book.readable, waits


def journal_entries(*, agent: str | None, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` journal rows (of one agent, if given), newest first, as
    ``{id, kind, agent, model, until, reason, by, at}`` plus ``until_ms``, ``act_id`` and
    ``problem`` (why the row does not read as a wait, or null). Rows that do not read are
    shown as they are: inspection works while the records are unreadable."""
    rows = WaitJournalEntry.objects.order_by("-id")
    if agent is not None:
        rows = rows.filter(agent=agent)
    out = []
    for row in rows.values(
        "id", "act_id", "kind", "agent", "model", "until_ms", "reason", "by", "at", "data"
    )[:limit]:
        until_ms = row["until_ms"]
        out.append(
            {
                "id": row["id"],
                "kind": row["kind"],
                "agent": row["agent"],
                "model": row["model"],
                "until": ms_to_datetime(until_ms)
                if until_ms is not None and 0 <= until_ms <= MAX_INSTANT_MS
                else None,
                "until_ms": until_ms,
                "reason": row["reason"],
                "by": row["by"],
                "at": row["at"],
                "act_id": str(row["act_id"]),
                "problem": entry_problem(row),
            }
        )
    return out
