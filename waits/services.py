"""Writes on provider waits (architecture.md §6): record a provider's stated wait, release waits.

``wait_release`` is the one release service behind the API, the admin and the management
command. Both services decide against this process's binding view (``waits.journal``) and
append one act; a write that fails keeps the act pending, binding here, and offers it again.
What goes with an act (its alert, its audit entry) is written in the act's own transaction, so
it lands exactly once, when the act does.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Final, Literal

from django.conf import settings
from django.db import DatabaseError, transaction

from agentops import telemetry
from agentops.alerts import alert_raise
from agentops.budgets import budget_release
from agentops.exceptions import NotFound, bad_field
from agentops.live import dashboard_hold_ended, dashboard_hold_started
from agentops.models import Agent, AuditEntry
from agentops.text import FAILURE_TEXT_LIMIT, bound_text, clean_requester
from agentops.wording import duration_text, instant_text

from .alerting import hold_already_alerted
from .clock import clock_ms
from .core import (
    AGENT_NAME_LIMIT,
    EVERY_AGENT,
    EVERY_MODEL,
    MODEL_NAME_LIMIT,
    Entry,
    WaitBook,
    hold_level,
    name_problem,
    set_changes,
    wait_binds,
    wait_deadline,
)
from .journal import OnInsert, checkpoint_write, journal_binding, journal_session, ms_to_datetime

logger = logging.getLogger(__name__)

RELEASE_REASON_LIMIT: Final = 1000  # agentops.models.AuditEntry.reason
REQUESTER_LIMIT: Final = 200
Via = Literal["api", "admin", "command"]
VIAS: Final = ("api", "admin", "command")
ReleaseState = Literal["recorded", "pending", "in-process override"]


@dataclass(frozen=True, slots=True)
class WaitRecorded:
    """What ``wait_record`` did. ``binding``/``until_ms``: whether (agent, model) is held after
    the act and until when (``None``: until released, or until unreadable records read
    again). ``changed``: whether this wait became the binding one. ``receipt``: ``recorded``,
    ``pending`` (binds here; offered to the journal again) or ``none`` (nothing to record)."""

    binding: bool
    until_ms: int | None
    changed: bool
    receipt: Literal["recorded", "pending", "none"]
    alerted: bool = False


@dataclass(frozen=True, slots=True)
class Receipt:
    """One lifted wait. ``release``: ``recorded`` (in the journal: every worker honours it),
    ``pending`` (honoured in this process now; every worker once the write lands) or
    ``in-process override`` (reserved: never produced here, since every failed write is
    retried and a replay is idempotent)."""

    agent: str
    model: str
    until_ms: int | None
    release: ReleaseState

    def out(self) -> dict[str, Any]:
        """As API.md shapes it; ``until`` is an aware datetime or None."""
        until = ms_to_datetime(self.until_ms) if self.until_ms is not None else None
        return {"agent": self.agent, "model": self.model, "until": until, "release": self.release}

    def as_json(self) -> dict[str, Any]:
        out = self.out()
        return {**out, "until": out["until"].isoformat() if out["until"] else None}


# --- recording a wait ------------------------------------------------------------------------


def wait_record(
    *,
    agent: Agent,
    model: str,
    retry_after_ms: float,
    reason: str,
    now_ms: float,
    provider: str = "",
) -> WaitRecorded:
    """Record the provider's stated wait for (agent, model) at ``now_ms`` (§6.2, §6.3), on
    ``provider`` when it is an alternate's ("": the agent's own, §6.11).

    An ephemeral agent records nothing (its run decides about the wait). A wait already over
    (zero or negative) records nothing and leaves a wait in force as it was. Otherwise the
    deadline is appended; the longest wait keeps binding. A wait that holds the model more
    than ``AGENTOPS_WAIT_ALERT_MS`` or until released raises a ``provider-wait`` alert once per
    hold. Call it outside a transaction: inside one, the act stays pending (binding here) until
    it is offered again. Raises ValueError for a model that is not a usable name.
    """
    problem = name_problem(model, limit=MODEL_NAME_LIMIT)
    if problem:
        raise ValueError(f"wait_record: model {problem}")
    stated = _stated_text(retry_after_ms)
    shown = f"{model} on {provider}" if provider else model
    if agent.kind == Agent.Kind.EPHEMERAL:
        logger.info(
            "agent %s (ephemeral) model %s: the provider asked to wait %s; "
            "an ephemeral run records no wait",
            agent.name,
            model,
            stated,
        )
        return WaitRecorded(binding=False, until_ms=None, changed=False, receipt="none")
    deadline = wait_deadline(now_ms=now_ms, retry_after_ms=retry_after_ms)
    if deadline.over:
        held, until = _hold_of(journal_binding(now_ms=now_ms), agent.name, model, now_ms, provider)
        logger.info(
            "agent %s model %s: the provider's stated wait (%s) is already over; nothing recorded",
            agent.name,
            model,
            stated,
        )
        return WaitRecorded(binding=held, until_ms=until, changed=False, receipt="none")

    reason = bound_text(
        clean_requester(str(reason), limit=10 * FAILURE_TEXT_LIMIT), FAILURE_TEXT_LIMIT
    )
    entry = Entry(
        kind="set",
        agent=agent.name,
        model=model,
        until=deadline.until,
        reason=reason,
        at=now_ms,
        provider=provider,
    )
    alert_ms = settings.AGENTOPS_WAIT_ALERT_MS
    with journal_session(now_ms=now_ms) as session:
        current = session.binding.lookup(agent.name, model, provider)
        changed = set_changes(current, deadline.until)
        alert = (
            changed
            and hold_level(deadline.until, now_ms=now_ms, alert_ms=alert_ms) > 0
            and not hold_already_alerted(agent=agent.name, model=shown, until=deadline.until)
        )
        message = _wait_alert_message(
            agent=agent.name,
            model=shown,
            until=deadline.until,
            stated=stated,
            reason=reason,
            now_ms=now_ms,
        )
        on_insert = (
            _wait_alert_writer(
                agent=agent.name,
                model=shown,
                until=deadline.until,
                stated=stated,
                reason=reason,
                message=message,
                now_ms=now_ms,
            )
            if alert
            else None
        )
        recorded = session.append(entry, by="provider", on_insert=on_insert)
        held, until = _hold_of(session.binding, agent.name, model, now_ms, provider)

    if changed:
        dashboard_hold_started(
            agent=agent.name,
            model=model,
            until_ms=deadline.until,
            reason=reason,
            set_at_ms=now_ms,
            source="recorded" if recorded else "pending",
        )
    if alert and not recorded:
        logger.error("provider-wait alert (stored once the wait is recorded): %s", message)
    log = (
        logger.warning
        if hold_level(deadline.until, now_ms=now_ms, alert_ms=alert_ms)
        else logger.info
    )
    log(
        "agent %s model %s: the provider asked to wait %s (%s); %s; %s",
        agent.name,
        model,
        stated,
        _until_text(deadline.until, now_ms),
        "this wait now binds"
        if changed
        else "an equal or longer wait already binds, so nothing changed",
        "recorded" if recorded else "pending: binds in this process, offered to the journal again",
    )
    return WaitRecorded(
        binding=held,
        until_ms=until,
        changed=changed,
        receipt="recorded" if recorded else "pending",
        alerted=alert,
    )


def _hold_of(
    book: WaitBook, agent: str, model: str, now_ms: float, provider: str = ""
) -> tuple[bool, int | None]:
    if book.unknown(agent, model):
        return True, None
    wait = book.lookup(agent, model, provider)
    if wait is not None and wait_binds(wait.until, now_ms):
        return True, wait.until
    return False, None


def _stated_text(retry_after_ms: object) -> str:
    """The provider's stated wait as a person reads it in a log line or an alert."""
    if isinstance(retry_after_ms, bool) or not isinstance(retry_after_ms, int | float):
        return f"{str(retry_after_ms)[:40]!r} (not a number)"
    try:
        value = float(retry_after_ms)
    except OverflowError:
        return f"{str(retry_after_ms)[:20]}… ms (too large for an instant)"
    return duration_text(value) if math.isfinite(value) else f"{value} ms (not a finite number)"


def _until_text(until: int | None, now_ms: float) -> str:
    if until is None:
        return "until released"
    return f"until {instant_text(until)} ({duration_text(until - now_ms)} from now)"


def _release_how(agent: str, model: str) -> str:
    return (
        "release it with POST /api/v1/waits/release "
        f'{{"agent": "{agent}", "model": "{model}", "reason": ...}}, '
        "the admin's Binding waits page, "
        f"or python manage.py release_wait {agent} --model {model} --reason TEXT"
    )


def _wait_alert_message(
    *, agent: str, model: str, until: int | None, stated: str, reason: str, now_ms: float
) -> str:
    return (
        f"Agent {agent} is held on model {model} {_until_text(until, now_ms)}: "
        f"the provider asked to wait {stated} ({bound_text(reason, 300)}). "
        f"No call to {model} is made for {agent} until then; {_release_how(agent, model)}."
    )


def _wait_alert_writer(
    *,
    agent: str,
    model: str,
    until: int | None,
    stated: str,
    reason: str,
    message: str,
    now_ms: float,
) -> OnInsert:
    """The alert, written in the wait's own transaction: raised once, when the wait lands."""

    def write(state: str) -> None:
        try:
            with transaction.atomic():
                alert_raise(
                    kind="provider-wait",
                    agent=agent,
                    model=model,
                    message=message,
                    data={
                        "until": ms_to_datetime(until).isoformat() if until is not None else None,
                        "until_ms": until,
                        "at_ms": now_ms,
                        "stated": stated,
                        "reason": reason,
                        "recorded": state,
                        "release": {
                            "api": "POST /api/v1/waits/release",
                            "admin": "Binding waits",
                            "command": f"release_wait {agent} --model {model}",
                        },
                    },
                )
        except DatabaseError:  # the wait counts more than its alert: record it without one
            logger.exception(
                "could not store the provider-wait alert for agent %s model %s: %s",
                agent,
                model,
                message,
            )

    return write


# --- releasing -----------------------------------------------------------------------------


def wait_release(
    *,
    agent: Any,
    model: Any = None,
    requester: Any = None,
    reason: Any = None,
    via: str,
    username: str = "",
    caller: str = "",
    now_ms: float | None = None,
) -> list[Receipt]:
    """Release an agent's wait for one model, or for every model (``model`` None or ``*``).

    Validates before changing anything: ``agent`` must name an agent that is not disposed or
    one with a listed (binding) wait, else NotFound; ``model`` must be a non-empty string
    without control characters, else BadRequest naming it (as for ``agent``, ``requester`` and
    ``reason``; the API refuses text that breaks ``agentops.validation`` before calling this,
    and what reaches here is cleaned: controls become spaces, lone surrogates U+FFFD, so an
    act can always be stored). The requester is cleaned and bounded and the act is recorded as
    ``api:<caller>`` (the API token's name; the free-text requester goes into the audit entry's
    data), ``admin:<username>`` or ``command:<requester>``. Writes an audit entry
    (``wait.release``) with the act and returns a receipt per lifted wait. A release only
    removes: it never lengthens a hold.
    """
    if via not in VIAS:
        raise ValueError(f"wait_release: via must be one of {VIAS}, not {via!r}")
    if agent == EVERY_AGENT:
        raise NotFound(
            "agent: no agent named '*' (a provider's limit on every agent is released by "
            "provider: send provider instead of agent)",
            data={"field": "agent"},
        )
    problem = name_problem(agent, limit=AGENT_NAME_LIMIT)
    if problem:
        raise bad_field("agent", problem)
    if model is None:
        model = EVERY_MODEL
    else:
        problem = name_problem(model, limit=MODEL_NAME_LIMIT, every_model=True)
        if problem:
            raise bad_field("model", f'{problem} (omit model, or send "*", to release every model)')
    requester = _text_field("requester", requester, REQUESTER_LIMIT)
    reason = _text_field("reason", reason, RELEASE_REASON_LIMIT)
    by = {
        "api": f"api:{clean_requester(caller or requester)}",
        "admin": f"admin:{clean_requester(username)}",
        "command": f"command:{requester}",
    }[via]
    now = clock_ms() if now_ms is None else now_ms

    if not Agent.objects.filter(
        name=agent, disposed_at__isnull=True
    ).exists() and not journal_binding(now_ms=now).agent_binding(agent, now):
        raise NotFound(
            f"agent: no agent named {agent!r}, and no wait is listed for one",
            data={"field": "agent"},
        )

    # A spent budget's hold (kept beside the journal, §18.3) is on every model: a release of
    # every model lifts it, for the rest of its period, audited with the journal's holds.
    budget_lifted = (
        [
            (EVERY_MODEL, math.ceil(h.until.timestamp() * 1000))
            for h in budget_release(agent=agent, now=ms_to_datetime(math.floor(now)))
        ]
        if model == EVERY_MODEL
        else []
    )
    with journal_session(now_ms=now) as session:
        lifted = budget_lifted + _lifted(session.binding, agent, model, now)

        def audit(state: str) -> None:
            AuditEntry.objects.create(
                actor=by,
                action="wait.release",
                target=f"{agent}/{model}",
                reason=reason,
                data={
                    "agent": agent,
                    "model": model,
                    "via": via,
                    "requester": requester,
                    "receipts": [
                        Receipt(
                            agent, m, until, "pending" if state == "pending" else "recorded"
                        ).as_json()
                        for m, until in lifted
                    ],
                    "recorded_late": state == "pending",
                },
            )

        recorded = session.append(
            Entry(kind="release", agent=agent, model=model, reason=reason, at=now),
            by=by,
            on_insert=audit,
        )

    state: ReleaseState = "recorded" if recorded else "pending"
    receipts = [Receipt(agent, m, until, state) for m, until in lifted]
    if telemetry.enabled:
        # A span an operator finds by agent, under the request (or command) that released.
        telemetry.tracer().start_span(
            "agentops.wait.release",
            attributes={
                "agentops.agent": agent,
                "agentops.wait.model": model,
                "agentops.release.by": by,
                "agentops.release.reason": telemetry.bounded(reason),
                "agentops.release.lifted": len(receipts),
                "agentops.release.state": state,
            },
        ).end()
    for lifted_model, _ in lifted:
        dashboard_hold_ended(
            agent=agent,
            model=lifted_model,
            why=f"released by {by}" + (f": {reason}" if reason else ""),
        )
    logger.warning(
        "provider wait released: agent %s model %s by %s (%s): %d wait(s) lifted; "
        "the release is %s%s",
        agent,
        model,
        by,
        reason or "no reason given",
        len(receipts),
        state,
        "" if recorded else " (honoured in this process now, offered to the journal again)",
    )
    return receipts


def _text_field(field: str, value: Any, limit: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad_field(field, "must be a string")
    return clean_requester(value, limit=limit)


def _lifted(book: WaitBook, agent: str, model: str, now_ms: float) -> list[tuple[str, int | None]]:
    """(model, until) of each hold a release of (agent, model) lifts. While the records are
    unreadable, the hold they impose is lifted too (until null)."""
    if model == EVERY_MODEL:
        lifted: list[tuple[str, int | None]] = []
        if book.unreadable is not None and agent not in book.known_agents:
            lifted.append((EVERY_MODEL, None))
        lifted += sorted((w.model, w.until) for w in book.agent_binding(agent, now_ms))
        return lifted
    if book.unknown(agent, model):
        return [(model, None)]
    # The model's holds on every provider (the agent's own, and alternates' of that name).
    return sorted(
        ((w.model, w.until) for w in book.agent_binding(agent, now_ms) if w.model == model),
        key=lambda lifted: (lifted[1] is None, lifted[1] or 0),
    )


# --- checkpoints ------------------------------------------------------------------------------


def journal_checkpoint(*, by: str, now_ms: float | None = None) -> int:
    """Append a checkpoint of the waits binding now, so a full read starts there (the rows
    before it stay, never read again). Refused (Conflict) while the records are unreadable.
    Returns the checkpoint row's id."""
    return checkpoint_write(now_ms=clock_ms() if now_ms is None else now_ms, by=by)
