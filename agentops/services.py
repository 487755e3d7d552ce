"""Core writes: providers, agents and their history rows. API handlers, admin actions,
commands and the layers above call these."""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from . import rows
from .exceptions import Conflict, bad_field
from .models import (
    CONTEXT_WINDOW_MAX,
    CONTEXT_WINDOW_MIN,
    Agent,
    HistoryRow,
    Provider,
    default_project_id,
)
from .providers import provider_problem


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
    project_id: int | None = None,
    context_window: int | None = None,
    context_policy: str | None = None,
) -> Agent:
    provider_row = Provider.objects.filter(name=provider).first()
    if provider_row is None:
        raise bad_field("provider", f"no provider named {provider!r}")
    fallbacks = fallbacks_checked(
        fallbacks or [], model=model, provider=provider, max_tokens=max_tokens
    )
    check_context_window(context_window, max_tokens)
    if context_policy is None:  # residents trim; the others keep failing as they did
        resident = kind == Agent.Kind.RESIDENT
        context_policy = Agent.ContextPolicy.TRIM if resident else Agent.ContextPolicy.FAIL
    try:
        with transaction.atomic():
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
                context_window=context_window,
                context_policy=context_policy,
                project_id=project_id if project_id is not None else default_project_id(),
            )
    except IntegrityError:
        raise Conflict(
            f"the agent name {name!r} is taken (names are never reused)", data={"field": "name"}
        ) from None


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
    fallbacks: list[dict[str, Any]], *, model: str, provider: str, max_tokens: int | None
) -> list[dict[str, Any]]:
    """An agent's alternates as stored (architecture.md §6.11): each provider found, each
    (provider, model) neither the agent's own nor listed before, each window one the agent's
    own could be (``check_context_window``: the answer's ``max_tokens`` goes to the alternate
    too). Raises ``BadRequest`` naming the field."""
    names = {f["provider"] for f in fallbacks}
    known = {p.name: p for p in Provider.objects.filter(name__in=names)}
    seen = {(provider, model)}
    stored = []
    for index, entry in enumerate(fallbacks):
        if entry["provider"] not in known:
            raise bad_field(
                f"fallbacks[{index}].provider", f"no provider named {entry['provider']!r}"
            )
        target = (entry["provider"], entry["model"])
        if target in seen:
            raise bad_field(
                f"fallbacks[{index}].model",
                f"{entry['model']!r} on {entry['provider']!r} is already the agent's own "
                "provider and model or an earlier alternate",
            )
        seen.add(target)
        check_context_window(
            entry.get("context_window"), max_tokens, field=f"fallbacks[{index}].context_window"
        )
        row = known[entry["provider"]]
        # The provider's id and kind kept beside its name: routing reads no provider rows.
        stored.append(
            {
                "provider": entry["provider"],
                "model": entry["model"],
                "context_window": entry.get("context_window"),
                "provider_id": row.pk,
                "kind": row.kind,
            }
        )
    return stored


def agent_update(*, agent: Agent, changes: dict[str, Any]) -> Agent:
    allowed = {"model", "system", "max_tokens", "fallbacks", "context_window", "context_policy"}
    # A new max_tokens is checked against the alternates' windows as against the agent's own.
    if "fallbacks" in changes or "model" in changes or "max_tokens" in changes:
        listed = changes.get("fallbacks")
        changes = {
            **changes,
            "fallbacks": fallbacks_checked(
                listed if listed is not None else list(agent.fallbacks or []),
                model=changes.get("model") or agent.model,
                provider=agent.provider.name,
                max_tokens=changes.get("max_tokens", agent.max_tokens),
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


def history_append(*, agent: Agent, participant: str, role: str, content: Any) -> HistoryRow:
    """Append one row at the next sequence number. Call inside a transaction that holds the
    agent's row lock (``Agent.objects.select_for_update()``), so two writers never collide."""
    # One statement (the sequence number is computed in the insert): every turn appends here.
    next_seq = (
        f"(SELECT COALESCE(MAX(seq), 0) + 1 FROM {HistoryRow._meta.db_table} WHERE agent_id = %s)"
    )
    row = HistoryRow(agent=agent, participant=participant, role=role, content=content)
    return rows.insert(row, computed={"seq": (next_seq, [agent.pk])})
