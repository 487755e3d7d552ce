"""Core writes: providers, agents and their history rows. API handlers, admin actions,
commands and the layers above call these."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from . import rows
from .exceptions import Conflict, bad_field
from .models import (
    CONTEXT_WINDOW_MAX,
    CONTEXT_WINDOW_MIN,
    Agent,
    AuditEntry,
    HistoryRow,
    Project,
    Provider,
    default_project_id,
)
from .providers import provider_problem
from .selectors import providers_granted


def provider_create(*, name: str, kind: str, base_url: str, api_key_env: str = "") -> Provider:
    """Create a provider. Refused (BadRequest naming the field) when ``base_url`` breaks the
    provider policy or ``api_key_env`` is not an allowed variable set in the environment
    (``agentops.providers``). No DNS: a host name is checked when it is called."""
    refused = provider_problem(base_url=base_url, api_key_env=api_key_env)
    if refused:
        raise bad_field(*refused)
    try:
        with transaction.atomic():
            return Provider.objects.create(
                name=name, kind=kind, base_url=base_url, api_key_env=api_key_env
            )
    except IntegrityError:
        raise Conflict(
            f"a provider named {name!r} already exists", data={"field": "name"}
        ) from None


def agent_create(
    *,
    name: str,
    kind: str,
    provider: str,
    model: str,
    participant: str | None = None,
    system: str = "",
    max_tokens: int | None = None,
    thinking_budget: int | None = None,
    stream: bool = True,
    tools: list[dict[str, Any]] | None = None,
    fallbacks: list[dict[str, Any]] | None = None,
    pool: list[dict[str, Any]] | None = None,
    hedge_after_ms: int | None = None,
    project_id: int | None = None,
    context_window: int | None = None,
    context_policy: str | None = None,
) -> Agent:
    project_id = project_id if project_id is not None else default_project_id()
    if context_policy is None:  # residents trim; the others keep failing as they did
        resident = kind == Agent.Kind.RESIDENT
        context_policy = Agent.ContextPolicy.TRIM if resident else Agent.ContextPolicy.FAIL
    try:
        with transaction.atomic():
            _project_grant_held(project_id)
            # A provider not granted to the project answers as an unknown one: its name is
            # not told.
            provider_row = providers_granted(project_id=project_id).filter(name=provider).first()
            if provider_row is None:
                raise bad_field("provider", f"no provider named {provider!r}")
            pool = targets_checked(
                pool or [],
                field="pool",
                seen={(provider, model)},
                max_tokens=max_tokens,
                project_id=project_id,
            )
            fallbacks = fallbacks_checked(
                fallbacks or [],
                model=model,
                provider=provider,
                max_tokens=max_tokens,
                project_id=project_id,
                pool=pool,
            )
            check_context_window(context_window, max_tokens)
            return Agent.objects.create(
                name=name,
                kind=kind,
                provider=provider_row,
                model=model,
                participant=participant or name,
                system=system,
                max_tokens=max_tokens,
                thinking_budget=thinking_budget,
                stream=stream,
                tools=tools or [],
                fallbacks=fallbacks,
                pool=pool,
                hedge_after_ms=hedge_after_ms,
                context_window=context_window,
                context_policy=context_policy,
                project_id=project_id,
            )
    except IntegrityError:
        raise Conflict(
            f"the agent name {name!r} is taken (names are never reused)", data={"field": "name"}
        ) from None


def _project_grant_held(project_id: int) -> None:
    """Hold the project's row (FOR NO KEY UPDATE) for the rest of the transaction, so its grant
    does not change while an agent's providers are checked against it and written: a grant made
    meanwhile waits, then sees the agent (``project_providers_grant``)."""
    Project.objects.select_for_update(no_key=True).filter(pk=project_id).exists()


def check_context_window(
    window: int | None, max_tokens: int | None, *, field: str = "context_window"
) -> None:
    """A configured window (the agent's, or an alternate's under ``field``) is one a model may
    have, CONTEXT_WINDOW_MIN to CONTEXT_WINDOW_MAX tokens, and leaves room for the answer:
    larger than ``max_tokens``. Raises ``BadRequest`` naming ``field``."""
    if window is None:
        return
    if not CONTEXT_WINDOW_MIN <= window <= CONTEXT_WINDOW_MAX:
        raise bad_field(
            field, f"must be from {CONTEXT_WINDOW_MIN} to {CONTEXT_WINDOW_MAX:,} tokens"
        )
    if max_tokens is not None and window <= max_tokens:
        raise bad_field(
            field,
            f"must be larger than max_tokens ({max_tokens}): the answer is part of the window",
        )


def fallbacks_checked(
    fallbacks: list[dict[str, Any]],
    *,
    model: str,
    provider: str,
    max_tokens: int | None,
    project_id: int | None = None,
    pool: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """An agent's alternates as stored (architecture.md §6.11): ``targets_checked``, none the
    agent's own target or a member of its pool."""
    seen = {(provider, model)} | {(m["provider"], m["model"]) for m in pool or []}
    return targets_checked(
        fallbacks, field="fallbacks", seen=seen, max_tokens=max_tokens, project_id=project_id
    )


def targets_checked(
    entries: list[dict[str, Any]],
    *,
    field: str,
    seen: set[tuple[str, str]],
    max_tokens: int | None,
    project_id: int | None = None,
) -> list[dict[str, Any]]:
    """An agent's alternates or pool members as stored (§6.11, §6.15): each provider found
    (and granted to ``project_id``, when given: one not granted answers as unknown), each
    (provider, model) not in ``seen`` nor listed before, each window one the agent's own could
    be (``check_context_window``: the answer's ``max_tokens`` goes to every target). A pool
    member keeps its ``weight`` (default 1). Raises ``BadRequest`` naming ``field[i].name``."""
    names = {f["provider"] for f in entries}
    found = (
        Provider.objects.all() if project_id is None else providers_granted(project_id=project_id)
    )
    known = {p.name: p for p in found.filter(name__in=names)}
    seen = set(seen)
    stored = []
    for index, entry in enumerate(entries):
        if entry["provider"] not in known:
            raise bad_field(
                f"{field}[{index}].provider", f"no provider named {entry['provider']!r}"
            )
        target = (entry["provider"], entry["model"])
        if target in seen:
            raise bad_field(
                f"{field}[{index}].model",
                f"{entry['model']!r} on {entry['provider']!r} is already the agent's own "
                "provider and model, a pool member or an earlier alternate",
            )
        seen.add(target)
        check_context_window(
            entry.get("context_window"), max_tokens, field=f"{field}[{index}].context_window"
        )
        row = known[entry["provider"]]
        # The provider's id and kind kept beside its name: routing reads no provider rows.
        kept = {
            "provider": entry["provider"],
            "model": entry["model"],
            "context_window": entry.get("context_window"),
            "provider_id": row.pk,
            "kind": row.kind,
        }
        if field == "pool":
            kept["weight"] = entry.get("weight") or 1
        stored.append(kept)
    return stored


def agent_update(*, agent: Agent, changes: dict[str, Any]) -> Agent:
    allowed = {
        "model",
        "system",
        "max_tokens",
        "fallbacks",
        "pool",
        "hedge_after_ms",
        "context_window",
        "context_policy",
    }
    with transaction.atomic():
        # A new max_tokens is checked against the alternates' windows as against the agent's own.
        if {"fallbacks", "pool", "model", "max_tokens"} & set(changes):
            _project_grant_held(agent.project_id)
            listed, members = changes.get("fallbacks"), changes.get("pool")
            model = changes.get("model") or agent.model
            max_tokens = changes.get("max_tokens", agent.max_tokens)
            pool = targets_checked(
                members if members is not None else list(agent.pool or []),
                field="pool",
                seen={(agent.provider.name, model)},
                max_tokens=max_tokens,
                project_id=agent.project_id,
            )
            changes = {
                **changes,
                "pool": pool,
                "fallbacks": fallbacks_checked(
                    listed if listed is not None else list(agent.fallbacks or []),
                    model=model,
                    provider=agent.provider.name,
                    max_tokens=max_tokens,
                    project_id=agent.project_id,
                    pool=pool,
                ),
            }
        fields = [f for f in changes if f in allowed]
        check_context_window(
            changes.get("context_window", agent.context_window),
            changes.get("max_tokens", agent.max_tokens),
        )
        for field in fields:
            setattr(agent, field, changes[field])
        if fields:
            agent.save(update_fields=fields)
    return agent


def project_providers_grant(*, project: Project, names: list[str], actor: str) -> list[Provider]:
    """Grant ``project`` exactly the providers ``names``, in place of any earlier list, and
    audit it; the granted providers come back by name. Refused, with nothing changed:
    ``BadRequest`` naming ``providers[i]`` for a name no provider has; ``Conflict`` when a live
    agent of the project names a provider left out (its provider or an alternate's): change or
    dispose of that agent first, so no agent calls a provider its project was not granted."""
    known = {p.name: p for p in Provider.objects.filter(name__in=set(names))}
    for index, name in enumerate(names):
        if name not in known:
            raise bad_field(f"providers[{index}]", f"no provider named {name!r}")
    granted = {p.pk for p in known.values()}
    with transaction.atomic():
        # Locked: an agent created in the project meanwhile waits for the grant, then is
        # checked against it.
        locked = Project.objects.select_for_update().get(pk=project.pk)
        left_out = _agents_naming_others(project_id=locked.pk, granted=granted)
        if left_out:
            raise Conflict(
                f"{len(left_out)} live agent target(s) of project {locked.name!r} name a provider "
                "the list leaves out: change or dispose of those agents first",
                data={"field": "providers", "agents": left_out[:20]},
            )
        before = (
            sorted(locked.granted_providers.values_list("name", flat=True))
            if locked.providers_granted_at is not None
            else None
        )
        locked.granted_providers.set(granted)
        locked.providers_granted_at = timezone.now()
        locked.save(update_fields=["providers_granted_at"])
        AuditEntry.objects.create(
            actor=actor,
            action="project.providers-grant",
            target=f"project:{locked.name}",
            data={"providers": sorted(known), "before": before},
        )
    return sorted(known.values(), key=lambda p: p.name)


def _agents_naming_others(*, project_id: int, granted: set[int]) -> list[dict[str, str]]:
    """Each live agent's target (its own provider or an alternate's) outside ``granted``."""
    found = []
    live = Agent.objects.filter(project_id=project_id, disposed_at__isnull=True)
    for agent in live.select_related("provider").order_by("name"):
        if agent.provider_id not in granted:
            found.append(
                {"agent": agent.name, "field": "provider", "provider": agent.provider.name}
            )
        for field in ("pool", "fallbacks"):
            listed = getattr(agent, field)
            for index, entry in enumerate(listed if isinstance(listed, list) else []):
                if isinstance(entry, dict) and entry.get("provider_id") not in granted:
                    found.append(
                        {
                            "agent": agent.name,
                            "field": f"{field}[{index}].provider",
                            "provider": str(entry.get("provider")),
                        }
                    )
    return found


def history_append(
    *, agent: Agent, participant: str, role: str, content: Any, note_kind: str = ""
) -> HistoryRow:
    """Append one row at the next sequence number. Call inside a transaction that holds the
    agent's row lock (``Agent.objects.select_for_update()``), so two writers never collide."""
    # One statement (the sequence number is computed in the insert): every turn appends here.
    next_seq = (
        f"(SELECT COALESCE(MAX(seq), 0) + 1 FROM {HistoryRow._meta.db_table} WHERE agent_id = %s)"
    )
    row = HistoryRow(
        agent=agent, participant=participant, role=role, content=content, note_kind=note_kind
    )
    return rows.insert(row, computed={"seq": (next_seq, [agent.pk])})
