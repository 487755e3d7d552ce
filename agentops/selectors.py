"""Reads shared by the API, the admin and the dashboard."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef, QuerySet

from . import rows
from .exceptions import NotFound
from .models import Agent, Alert, ApiToken, HistoryRow, Project, Provider
from .validation import text_problem

ID_LIMIT = 2**63 - 1  # the largest id PostgreSQL's bigint holds


def name_storable(name: object) -> bool:
    """Whether ``name`` could be a stored name at all (one with a NUL, a lone surrogate or a
    control is unknown without asking the database, which would refuse the query)."""
    return isinstance(name, str) and len(name) <= 100 and text_problem(name, line=True) is None


def agent_for(*, token: ApiToken, name: str) -> Agent:
    """The live agent named ``name`` as ``token`` may see it: the one lookup behind every
    client-named agent (the API, the websocket). A non-operator token sees only its own
    project's agents; another project's agent answers exactly as an unknown name does, so names
    of other projects do not leak. A name that could not be stored (NUL, a lone surrogate, a
    control) is unknown too."""
    if name_storable(name):
        # Hand-written (``agentops.rows``): every request that names an agent reads it.
        sql = f"""
            SELECT {rows.columns(Agent, "a")}, {rows.columns(Provider, "p")}, {rows.columns(Project, "j")}
            FROM {Agent._meta.db_table} a
            JOIN {Provider._meta.db_table} p ON p.id = a.provider_id
            JOIN {Project._meta.db_table} j ON j.id = a.project_id
            WHERE a.name = %s AND a.disposed_at IS NULL"""
        params: list[Any] = [name]
        if not token.operator:
            sql += " AND a.project_id = %s"
            params.append(token.project_id)
        found = rows.fetch(sql + " ORDER BY a.id LIMIT 1", params, Agent, Provider, Project)
        if found:
            agent, provider, project = found[0]
            assert (
                isinstance(agent, Agent)
                and isinstance(provider, Provider)
                and isinstance(project, Project)
            )
            agent.provider, agent.project = provider, project
            return agent
    raise NotFound(f"no agent named {name!r}", data={"field": "name"})


def providers_granted(*, project_id: int) -> QuerySet[Provider]:
    """The providers the project's agents may name: the list an operator granted, or every
    provider while none was granted (``providers_granted_at`` null). One lazy query, read
    fresh each time: a grant binds the next request."""
    never_granted = Project.objects.filter(pk=project_id, providers_granted_at__isnull=True)
    granted = Project.granted_providers.through.objects.filter(
        project_id=project_id, provider_id=OuterRef("pk")
    )
    return Provider.objects.filter(Exists(never_granted) | Exists(granted))


def provider_for(*, token: ApiToken, name: str) -> Provider:
    """The provider named ``name`` as ``token`` may see it: any for an operator, a granted one
    for a tenant. One not granted answers exactly as an unknown name does."""
    found = (
        Provider.objects.all() if token.operator else providers_granted(project_id=token.project_id)
    )
    provider = found.filter(name=name).first() if name_storable(name) else None
    if provider is None:
        raise NotFound(f"no provider named {name!r}", data={"field": "name"})
    return provider


def visible_to(token: ApiToken, agent: Agent) -> bool:
    """Whether ``token`` may see ``agent`` (its project's, or any for an operator)."""
    return bool(token.operator) or agent.project_id == token.project_id


def id_valid(value: int) -> bool:
    """Whether ``value`` can be a row id at all (a larger one would overflow the query)."""
    return 0 < value <= ID_LIMIT


def agent_get(*, name: str) -> Agent:
    agent = (
        Agent.objects.select_related("provider").filter(name=name, disposed_at__isnull=True).first()
    )
    if agent is None:
        raise NotFound(f"no agent named {name!r}", data={"field": "name"})
    return agent


def history_row_out(row: HistoryRow) -> dict[str, Any]:
    return {
        "id": row.pk,
        "seq": row.seq,
        "participant": row.participant,
        "role": row.role,
        "content": row.content,
        "state": row.state,
        "set_aside_at": row.set_aside_at,
        "set_aside_reason": row.set_aside_reason,
        "created_at": row.created_at,
    }


def alert_out(alert: Alert) -> dict[str, Any]:
    """An alert with API.md's field names (instants as datetimes, for the API's schema)."""
    return {
        "id": alert.pk,
        "kind": alert.kind,
        "agent": alert.agent,
        "model": alert.model,
        "verdict": alert.verdict or None,
        "message": alert.message,
        "data": alert.data,
        "created_at": alert.created_at,
        "acknowledged_at": alert.acknowledged_at,
    }


def alert_json(alert: Alert) -> dict[str, Any]:
    """``alert_out`` as plain JSON (instants as ISO text): the one shape the dashboard's
    ``alert.raised`` event, its snapshot and the webhook body carry."""
    return {
        k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in alert_out(alert).items()
    }
