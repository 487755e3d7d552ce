"""Setting and removing a budget from an interface (``PUT``/``DELETE .../budget`` and the admin's
budget page): one way for both, so a budget set in the admin follows the API's ledger rules
(architecture.md §18) and lets the held turns go on the same way."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from functools import partial

from django.db import transaction

from agentops.budget_api import budget_put
from agentops.budgets import holds_changed_here
from agentops.models import Agent, Budget, Project
from inference.models import Turn
from interfaces.spend import spent_since
from turns.queue import schedule_drain
from waits.admission import BUDGET_HOLDS_CACHE_S


def _drain_held(owner: Agent | Project) -> None:
    """The owner's held turns check again now, not at their next re-check, once every
    process's copy of the holds has expired (waits.admission)."""
    held = Turn.objects.filter(status=Turn.Status.HELD)
    held = (
        held.filter(agent=owner) if isinstance(owner, Agent) else held.filter(agent__project=owner)
    )
    for agent_id in set(held.values_list("agent_id", flat=True)):
        schedule_drain(agent_id, BUDGET_HOLDS_CACHE_S + 0.2)


def owner_budget_set(
    *, owner: Agent | Project, amount: Decimal, period: str, warn_at: Decimal, now: datetime
) -> Budget:
    """Set the owner's budget (checked values: ``agentops.budget_api.check_budget``), its
    ledger started from the period's calls so far or kept; a raise may lift the hold, so the
    held turns are drained."""
    budget = budget_put(
        owner=owner,
        amount=amount,
        period=period,
        warn_at=warn_at,
        now=now,
        spent_since=partial(spent_since, owner),
    )
    _drain_held(owner)
    return budget


def owner_budget_remove(*, owner: Agent | Project) -> bool:
    """Remove the owner's budget (its hold goes with it); False when it had none."""
    with transaction.atomic():
        key: dict[str, Agent | Project] = (
            {"agent": owner} if isinstance(owner, Agent) else {"project": owner}
        )
        deleted, _ = Budget.objects.filter(**key).delete()
        if deleted:
            transaction.on_commit(holds_changed_here)
    if deleted:
        _drain_held(owner)
    return bool(deleted)
