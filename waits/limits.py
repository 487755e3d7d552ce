"""A provider's limit where the provider puts it (architecture.md §6.12): waits that bind every
agent on a provider's model, or the whole account, and operators' own holds.

They are rows of the same journal as an agent's waits (agent ``*``), under the same rules:
the longest wait wins, a stated wait that is not a finite number holds until released, an
act whose write fails binds here and is offered again. ``limit_record`` is the one place a
refusal's wait is recorded at its scope; ``limit_release`` and ``operator_hold`` /
``operator_lift`` are the operators' acts, each audited.
"""

from __future__ import annotations

import logging
import math
import random
import uuid
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction

from agentops.alerts import alert_raise
from agentops.exceptions import NotFound, bad_field
from agentops.models import Agent, AuditEntry, Provider
from agentops.text import FAILURE_TEXT_LIMIT, bound_text, clean_requester
from agentops.wording import instant_text
from calls.limits import acceleration_cooldown
from calls.pacing import Pacer
from calls.types import ProviderError

from .clock import clock_ms
from .core import (
    AGENT_NAME_LIMIT,
    EVERY_AGENT,
    EVERY_MODEL,
    MAX_INSTANT_MS,
    MODEL_NAME_LIMIT,
    Entry,
    Wait,
    name_problem,
    set_changes,
    wait_binds,
    wait_deadline,
)
from .journal import OnInsert, journal_binding, journal_session, ms_to_datetime
from .services import RELEASE_REASON_LIMIT, WaitRecorded, wait_record

logger = logging.getLogger(__name__)


def limit_record(
    *,
    agent: Agent,
    provider: Provider,
    model: str,
    error: ProviderError,
    now_ms: float,
    own_provider: bool = True,
) -> WaitRecorded:
    """Record what a refusal says at the scope it binds (§6.12): an agent's own wait as
    before (``waits.services.wait_record``), or a wait on every agent of ``provider``'s
    ``model`` or of the whole account. ``own_provider``: whether ``provider`` is the agent's
    own (its agent-scope rows name it "")."""
    stated = error.retry_after_ms if error.retry_after_ms is not None else 0.0
    reason = f"{error.type} (HTTP {error.http_status}): {error.message[:300]}"
    if error.scope not in ("model", "provider"):
        return wait_record(
            agent=agent,
            model=model,
            provider="" if own_provider else provider.name,
            retry_after_ms=stated,
            reason=reason,
            now_ms=now_ms,
        )
    scoped_model = model if error.scope == "model" else EVERY_MODEL
    own_until: int | None = None
    lengthened_by = ""
    if error.acceleration:
        cooldown = acceleration_cooldown(
            now_ms=now_ms,
            stated_ms=error.retry_after_ms,
            own_ms=settings.AGENTOPS_ACCELERATION_COOLDOWN_MS,
            jitter_ms=settings.AGENTOPS_ACCELERATION_JITTER_MS,
            jitter=random.random(),
        )
        until = None if cooldown.until is None else math.ceil(cooldown.until)
        own_until = math.ceil(cooldown.own_until)
        lengthened_by = model if cooldown.lengthened else ""
    else:
        deadline = wait_deadline(now_ms=now_ms, retry_after_ms=stated)
        if deadline.over:
            return WaitRecorded(binding=False, until_ms=None, changed=False, receipt="none")
        until = deadline.until
    return _scoped_set(
        Entry(
            kind="set",
            agent=EVERY_AGENT,
            model=scoped_model,
            until=until,
            reason=bound_text(clean_requester(reason, limit=10 * FAILURE_TEXT_LIMIT)),
            at=now_ms,
            provider=provider.name,
            own_until=own_until,
            lengthened_by=lengthened_by,
        ),
        spend=error.type == "quota",
        now_ms=now_ms,
    )


def _scoped_set(entry: Entry, *, spend: bool, now_ms: float) -> WaitRecorded:
    with journal_session(now_ms=now_ms) as session:
        current = session.binding.lookup(entry.agent, entry.model, entry.provider)
        changed = set_changes(current, entry.until)
        # Once per episode: a wait that starts one (nothing bound the scope), or a spent
        # credit, which an operator must act on at once.
        episode = changed and (current is None or not wait_binds(current.until, now_ms) or spend)
        on_insert = _limit_alert(entry, now_ms) if episode else None
        recorded = session.append(entry, by="provider", on_insert=on_insert)
    where = _scope_text(entry.provider, entry.model)
    logger.warning(
        "%s: the provider's limit binds %s (%s); %s",
        where,
        _until_text(entry.until),
        entry.reason[:300],
        "recorded" if recorded else "pending: binds in this process, offered to the journal again",
    )
    return WaitRecorded(
        binding=entry.until is None or entry.until > now_ms,
        until_ms=entry.until,
        changed=changed,
        receipt="recorded" if recorded else "pending",
        alerted=episode,
    )


def _scope_text(provider: str, model: str) -> str:
    if model == EVERY_MODEL:
        return f"every agent and model on provider {provider}"
    return f"every agent on provider {provider}'s model {model}"


def _until_text(until: int | None) -> str:
    return "until released" if until is None else f"until {instant_text(until)}"


def _limit_alert(entry: Entry, now_ms: float) -> OnInsert:
    """The ``provider-limit`` alert, written in the wait's own transaction."""
    where = _scope_text(entry.provider, entry.model)
    message = (
        f"Provider {entry.provider}'s limit holds {where} {_until_text(entry.until)}: "
        f"{bound_text(entry.reason, 300)}. No call is made there until then; release it with "
        f'POST /api/v1/waits/release {{"provider": "{entry.provider}"'
        + (f', "model": "{entry.model}"' if entry.model != EVERY_MODEL else "")
        + ', "reason": ...} or the admin\'s provider page.'
    )

    def write(state: str) -> None:
        try:
            with transaction.atomic():
                alert_raise(
                    kind="provider-limit",
                    agent=EVERY_AGENT,
                    model=entry.model,
                    message=message,
                    data={
                        "provider": entry.provider,
                        "model": entry.model,
                        "scope": "provider" if entry.model == EVERY_MODEL else "model",
                        "until": _iso(entry.until),
                        "until_ms": entry.until,
                        "at_ms": now_ms,
                        "reason": entry.reason,
                        "acceleration": entry.own_until is not None,
                        "recorded": state,
                    },
                )
        except DatabaseError:  # the wait counts more than its alert
            logger.exception("could not store the provider-limit alert: %s", message)

    return write


def _iso(until: int | None) -> str | None:
    return ms_to_datetime(until).isoformat() if until is not None else None


# --- releasing a provider's scoped waits -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScopedReceipt:
    provider: str
    model: str
    scope: str
    until_ms: int | None
    release: str

    def as_json(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "model": self.model,
            "scope": self.scope,
            "until": _iso(self.until_ms),
            "release": self.release,
        }


def limit_release(
    *, provider: Any, model: Any = None, reason: Any, by: str, now_ms: float | None = None
) -> list[ScopedReceipt]:
    """Release a provider's scoped waits: one model's (and an acceleration cooldown it
    lengthened, back to the service's own pacing), or every model's (``model`` None or
    ``*``). An agent's own waits and an operator's holds are left as they are. Audited."""
    provider = _provider_named(provider)
    model = _model_field(model)
    reason = _reason(reason)
    now = clock_ms() if now_ms is None else now_ms
    with journal_session(now_ms=now) as session:
        release = Entry(
            kind="release", agent=EVERY_AGENT, model=model, reason=reason, at=now, provider=provider
        )
        # What it lifts is what the reduction says it lifts (a copy: the act itself applies
        # the release), binding waits only.
        lifted = [
            w for w in session.binding.copy().apply(release).lifted if wait_binds(w.until, now)
        ]

        def audit(state: str) -> None:
            AuditEntry.objects.create(
                actor=by,
                action="wait.release",
                target=f"{provider}/{model}",
                reason=reason,
                data={
                    "provider": provider,
                    "model": model,
                    "receipts": [
                        _receipt(w, "pending" if state == "pending" else "recorded").as_json()
                        for w in lifted
                    ],
                },
            )

        recorded = session.append(release, by=by, on_insert=audit)
    logger.warning(
        "provider limit released: provider %s model %s by %s (%s): %d wait(s)",
        provider,
        model,
        by,
        reason or "no reason given",
        len(lifted),
    )
    state = "recorded" if recorded else "pending"
    return [_receipt(w, state) for w in lifted]


def _receipt(wait: Wait, state: str) -> ScopedReceipt:
    return ScopedReceipt(wait.provider, wait.model, wait.scope, wait.until, state)


# --- operators' own holds --------------------------------------------------------------------


def operator_hold(
    *, provider: Any, model: Any = None, agent: Any = None, until: Any = None, reason: Any, by: str
) -> Wait:
    """An operator's own hold on a provider, one of its models or one agent's calls there
    (§6.12): until ``until`` (ms since the epoch) or, with None, until lifted. No release of
    a provider's waits lifts it; only ``operator_lift``. Audited; alerted like a limit."""
    provider = _provider_named(provider)
    model = _model_field(model)
    if agent is None:
        agent = EVERY_AGENT
    else:
        problem = name_problem(agent, limit=AGENT_NAME_LIMIT)
        if problem:
            raise bad_field("agent", problem)
        if not Agent.objects.filter(name=agent, disposed_at__isnull=True).exists():
            raise NotFound(f"agent: no agent named {agent!r}", data={"field": "agent"})
    now = clock_ms()
    if until is not None and (
        isinstance(until, bool)
        or not isinstance(until, int | float)
        or not math.isfinite(until)
        or until <= now
        or until > MAX_INSTANT_MS
    ):
        raise bad_field("until", "must be an instant in the future (or omitted: until lifted)")
    reason = _reason(reason)
    if not reason:
        raise bad_field("reason", "an operator's hold says why")
    entry = Entry(
        kind="hold",
        agent=agent,
        model=model,
        until=None if until is None else math.ceil(until),
        reason=reason,
        at=now,
        provider=provider,
        ref=uuid.uuid4().hex,
    )
    alert = _limit_alert(entry, now)

    def audited(state: str) -> None:
        AuditEntry.objects.create(
            actor=by,
            action="wait.hold",
            target=f"{provider}/{model}/{agent}",
            reason=reason,
            data={"id": entry.ref, "until": _iso(entry.until), "recorded": state},
        )
        alert(state)

    with journal_session(now_ms=now) as session:
        session.append(entry, by=by, on_insert=audited)
        return session.binding.holds[entry.ref]


def operator_lift(*, ref: str, reason: Any, by: str) -> Wait:
    """End an operator's hold (NotFound when no such hold binds). Audited."""
    reason = _reason(reason)
    now = clock_ms()
    with journal_session(now_ms=now) as session:
        hold = session.binding.holds.get(ref)
        if hold is None or not wait_binds(hold.until, now):
            raise NotFound(f"no operator hold {ref!r} is in force", data={"field": "id"})

        def audit(state: str) -> None:
            AuditEntry.objects.create(
                actor=by,
                action="wait.lift",
                target=f"{hold.provider}/{hold.model}/{hold.agent}",
                reason=reason,
                data={"id": ref, "recorded": state},
            )

        session.append(
            Entry(kind="lift", agent="", model="", at=now, ref=ref), by=by, on_insert=audit
        )
    return hold


def scoped_waits(now_ms: float | None = None) -> list[Wait]:
    """Every scoped wait and operator hold in force, longest first."""
    now = clock_ms() if now_ms is None else now_ms
    found = journal_binding(now_ms=now, fresh=True).scoped_binding(now)
    return sorted(found, key=lambda w: (w.until is not None, -(w.until or 0)))


def provider_limits(
    pacer: Pacer, provider: str, now_ms: float | None = None
) -> list[dict[str, Any]]:
    """What is known of each of ``provider``'s limits now, by model (``*``: the account):
    what its headers last said is left (§6.13) and the scoped waits that bind (§6.12)."""
    now = clock_ms() if now_ms is None else now_ms
    found: dict[str, dict[str, Any]] = {}

    def entry(model: str) -> dict[str, Any]:
        return found.setdefault(
            model,
            {
                "model": model,
                "remaining_requests": None,
                "remaining_tokens": None,
                "resets_at": None,
                "paced_until": None,
                "held_until": None,
                "held": False,
                "scope": "provider" if model == EVERY_MODEL else "model",
            },
        )

    for state in pacer.limits(provider):
        row = entry(str(state["model"]))
        requests, tokens = _number(state.get("rr")), _number(state.get("tr"))
        resets = [r for r in (_number(state.get("rt")), _number(state.get("tt"))) if r and r > now]
        row["remaining_requests"] = None if requests is None else int(requests)
        row["remaining_tokens"] = None if tokens is None else int(tokens)
        row["resets_at"] = _iso(math.ceil(min(resets))) if resets else None
        if requests is not None and requests <= 0 and resets:
            row["paced_until"] = _iso(math.ceil(min(resets)))
    for wait in scoped_waits(now):
        if wait.provider == provider and wait.agent == EVERY_AGENT:
            row = entry(wait.model)
            row["held"] = True
            row["held_until"] = _iso(wait.until)
    return sorted(found.values(), key=lambda r: r["model"])


def _number(value: object) -> float | None:
    if not isinstance(value, str | int | float) or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _provider_named(provider: Any) -> str:
    problem = name_problem(provider, limit=AGENT_NAME_LIMIT)
    if problem:
        raise bad_field("provider", problem)
    if not Provider.objects.filter(name=provider).exists():
        raise NotFound(f"provider: no provider named {provider!r}", data={"field": "provider"})
    return str(provider)


def _model_field(model: Any) -> str:
    if model is None:
        return EVERY_MODEL
    problem = name_problem(model, limit=MODEL_NAME_LIMIT, every_model=True)
    if problem:
        raise bad_field("model", f'{problem} (omit model, or send "*", for every model)')
    return str(model)


def _reason(reason: Any) -> str:
    if reason is None:
        return ""
    if not isinstance(reason, str):
        raise bad_field("reason", "must be a string")
    return clean_requester(reason, limit=RELEASE_REASON_LIMIT)
