"""The live operator dashboard's snapshot (architecture.md §9): everything the page shows, read now.

The live events that follow it are produced where things happen (``agentops.live`` lists
them). Instants are milliseconds since the epoch (``*_ms``): the page counts down against them
with the browser's clock, corrected by the snapshot's ``now_ms``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, Q

from agentops.budget_api import budget_out
from agentops.live import REASON_LIMIT, hold_out
from agentops.models import Agent, Alert, Budget, HistoryRow, Provider
from agentops.selectors import alert_json
from agentops.text import bound_text
from breaker.models import BreakerState
from calls.events import call_live_out
from calls.pacing import Pacer
from calls.progress import call_progress_read
from inference.models import InferenceCall
from interfaces.selectors import turns_waiting
from interfaces.spend import spend_currency, spend_today_by_agent, spend_total
from turns.context.selectors import last_input_tokens
from turns.serving_reads import serving_out
from waits.selectors import binding_waits

SNAPSHOT_CALLS = 200
SNAPSHOT_AGENTS = 300
SNAPSHOT_ALERTS = 25


def _ms(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp() * 1000


def dashboard_snapshot(pacer: Pacer, *, now_ms: float) -> dict[str, Any]:
    """Everything the page shows, read now: in-flight calls, binding holds, each agent's
    breaker and spend of today, today's total and the newest alerts. A fixed handful of
    queries whatever the number of rows. ``pacer``: the process's, whose quotas routing
    reads."""
    readable, waits = binding_waits(now_ms=now_ms)
    now = datetime.fromtimestamp(now_ms / 1000, tz=UTC)
    day, spent = spend_today_by_agent(now=now)
    return {
        "type": "snapshot",
        "now_ms": now_ms,
        "calls": _calls_in_flight(),
        "holds": [
            hold_out(
                agent=w["agent"],
                model=w["model"],
                until_ms=_ms(w["until"]),
                reason=w["reason"],
                set_at_ms=_ms(w["set_at"]),
                source=w["source"],
            )
            for w in waits
        ],
        "journal_readable": readable,
        # Turns whose next call waits (pacing after a 429, a retry delay, a re-arm), and why.
        "waiting": turns_waiting(now=now),
        "breakers": _breakers(pacer, now=now, spent=spent),
        # Today's spend of every agent (disposed ones too), the local day of the budgets' zone.
        "spend_today": {
            **spend_total(list(spent.values())),
            "day": day,
            "zone": settings.AGENTOPS_BUDGET_TIME_ZONE,
            "currency": spend_currency(),
        },
        # Providers in an episode of failures long enough to have raised provider-down.
        "providers_down": [
            {
                "provider": p.name,
                "since_ms": _ms(p.failing_since),
                "alerted_ms": _ms(p.down_alerted_at),
                "error": bound_text(str((p.last_failure or {}).get("message") or ""), REASON_LIMIT),
            }
            for p in Provider.objects.filter(down_alerted_at__isnull=False).order_by("name")
        ],
        "alerts": [alert_json(a) for a in Alert.objects.order_by("-id")[:SNAPSHOT_ALERTS]],
    }


def _calls_in_flight() -> list[dict[str, Any]]:
    """In-flight calls, each with its live progress when it has any (its counts, and its
    nearest deadline now rather than as of its send)."""
    rows = list(
        InferenceCall.objects.filter(outcome__isnull=True)
        .select_related("agent")
        .order_by("id")[:SNAPSHOT_CALLS]
    )
    live = call_progress_read([call.pk for call in rows])
    out = []
    for call in rows:
        entry = call_live_out(call, agent=call.agent.name)
        progress = live.get(call.pk)
        if progress is not None:
            entry.update({k: v for k, v in progress.items() if k not in ("id", "agent", "turn")})
        out.append(entry)
    return out


def _context_bar(agent: dict[str, Any], last_input: int | None) -> dict[str, Any]:
    known = [w for w in (agent["context_window"], agent["context_learned_window"]) if w]
    window = min(known) if known else None
    used = round(last_input / window, 4) if window and last_input else None
    return {"window": window, "last_input_tokens": last_input, "used_fraction": used}


def _serving(pacer: Pacer, agent_ids: list[int]) -> dict[int, dict[str, Any]]:
    """For each agent with alternates, the alternate serving it now (none: its own model)."""
    if not agent_ids:
        return {}
    now_ms = time.time() * 1000
    out = {}
    for agent in Agent.objects.select_related("provider").filter(id__in=agent_ids):
        serving = serving_out(pacer, agent, now_ms)
        if serving is not None:
            out[agent.pk] = {
                "provider": serving["provider"],
                "model": serving["model"],
                "reason": serving["reason"],
                "primary_until_ms": serving["primary_until"],
                "since_ms": _ms(serving["since"]),
            }
    return out


def _spend_of(item: dict[str, Any] | None) -> dict[str, Any]:
    if item is None:
        return {"cost": None, "calls": 0, "unpriced_calls": 0}
    return {k: item[k] for k in ("cost", "calls", "unpriced_calls")}


def _budgets(agents: list[dict[str, Any]], now: datetime) -> dict[int, list[dict[str, Any]]]:
    """Each agent's budgets, its own then its project's, as of ``now`` (one query)."""
    ids = [a["id"] for a in agents]
    projects = {a["project_id"] for a in agents}
    found = Budget.objects.filter(Q(agent_id__in=ids) | Q(project_id__in=projects))
    own: dict[int, dict[str, Any]] = {}
    of_project: dict[int, dict[str, Any]] = {}
    for b in found:
        out = budget_out(b, now)
        shown = {
            "amount": out["amount"],
            "period": out["period"],
            "spent": out["spent"],
            "held": out["held"],
            "resets_ms": _ms(out["resets_at"]),
        }
        if b.agent_id is not None:
            own[b.agent_id] = {"scope": "agent", **shown}
        elif b.project_id is not None:
            of_project[b.project_id] = {"scope": "project", **shown}
    return {
        a["id"]: [b for b in (own.get(a["id"]), of_project.get(a["project_id"])) if b is not None]
        for a in agents
    }


def _breakers(
    pacer: Pacer, *, now: datetime, spent: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each live agent's breaker, spend of today (``spent``, by agent name) and budgets, agents
    in trouble first (longest streak, then name)."""
    agents = list(
        Agent.objects.filter(disposed_at__isnull=True)
        .annotate(set_aside=Count("history", filter=Q(history__state=HistoryRow.State.SET_ASIDE)))
        .values(
            "id",
            "name",
            "project_id",
            "model",
            "kind",
            "set_aside",
            "context_window",
            "context_learned_window",
            "fallbacks",
        )
        .order_by("name")[:SNAPSHOT_AGENTS]
    )
    states = {
        s.agent_id: s for s in BreakerState.objects.filter(agent_id__in=[a["id"] for a in agents])
    }
    inputs = last_input_tokens(a["id"] for a in agents)
    serving = _serving(pacer, [a["id"] for a in agents if a["fallbacks"]])
    budgets = _budgets(agents, now) if agents else {}
    out = []
    for a in agents:
        state = states.get(a["id"])
        probe = None
        if state is not None and state.probe_status:
            probe = {
                "status": state.probe_status,
                "sent_ms": _ms(state.probe_sent_at),
                "verdict": bound_text(state.probe_verdict, REASON_LIMIT) or None,
            }
        out.append(
            {
                "agent": a["name"],
                "model": a["model"],
                "kind": a["kind"],
                "streak": state.streak if state else 0,
                "threshold": int(settings.AGENTOPS_BREAKER_THRESHOLD),
                "sheds_this_run": state.sheds_this_run if state else 0,
                "shed_cap": int(settings.AGENTOPS_BREAKER_SHED_CAP),
                "probe": probe,
                "set_aside": a["set_aside"],
                # The context bar: the last call's input against the known window (§5.9).
                "context": _context_bar(a, inputs.get(a["id"])),
                # The alternate serving it, and until when the primary is held (§6.11).
                "serving": serving.get(a["id"]),
                # Today's spend (unpriced calls counted apart) and the budgets it counts against.
                "spend_today": _spend_of(spent.get(a["name"])),
                "budgets": budgets.get(a["id"], []),
            }
        )
    out.sort(key=lambda b: (-b["streak"], b["probe"] is None, b["agent"]))
    return out
