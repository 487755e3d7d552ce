"""One provider-wait alert per hold (architecture.md §6.7): whether a new long hold of
(agent, model) is the one an operator was already told about.

A re-hold whose end is earlier than, or within a second of, the end of the last alerted hold
raises no new alert. A hold that ends later, or one after the last alerted hold ended or was
released, does. The last alerted hold is read from the last ``provider-wait`` alert of the
pair (its ``until_ms`` and the ``at_ms`` of the act that raised it) and the journal's releases.
"""

from __future__ import annotations

from typing import Final

from django.db import DatabaseError

from agentops.models import Alert

from .core import EVERY_MODEL
from .journal import ms_to_datetime
from .models import WaitJournalEntry

SAME_END_MS: Final = 1000


def hold_already_alerted(*, agent: str, model: str, until: int | None) -> bool:
    """Whether a hold of (agent, model) until ``until`` (None: until released) is covered by
    the last alert raised for the pair: that hold has neither ended nor been released, and
    the new one ends no later than a second after it. (A hold after the alerted one ended
    ends later than it, so it alerts by that rule.)"""
    try:
        return _covered(agent=agent, model=model, until=until)
    except DatabaseError:  # unreachable: the act stays pending; its alert is decided when it lands
        return False


def _covered(*, agent: str, model: str, until: int | None) -> bool:
    last = (
        Alert.objects.filter(kind="provider-wait", agent=agent, model=model)
        .order_by("-id")
        .values("data", "created_at")
        .first()
    )
    if last is None:
        return False
    data = last["data"] if isinstance(last["data"], dict) else {}
    last_until = data.get("until_ms")
    if last_until is not None and not isinstance(last_until, int | float):
        return False
    at_ms = data.get("at_ms")
    since = ms_to_datetime(at_ms) if isinstance(at_ms, int | float) else last["created_at"]
    released = WaitJournalEntry.objects.filter(
        kind=WaitJournalEntry.Kind.RELEASE,
        agent=agent,
        model__in=(model, EVERY_MODEL),
        at__gte=since,
    ).exists()
    if released:
        return False
    if until is None:
        return last_until is None
    return last_until is None or until <= last_until + SAME_END_MS
