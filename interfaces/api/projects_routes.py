"""API.md's providers granted to projects: which providers a project's agents may name
(architecture.md §12); and the limits an operator sets on a project's calls (§6.14). Mounted at
the API root: ``api.add_router("", router)``."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from django.http import HttpRequest
from ninja import Router, Schema, Status
from pydantic import BaseModel, Field

from agentops import services
from agentops.exceptions import NotFound
from agentops.models import ApiToken, Project
from agentops.project_limits import (
    LIMIT_MAXIMA,
    LIMITS_SHAPE,
    check_limits,
    project_limits_clear,
    project_limits_of,
    project_limits_put,
)
from agentops.selectors import name_storable
from interfaces.api.auth import OperatorTokenAuth, require_operator
from interfaces.api.body import check_fields, json_body
from interfaces.api.schemas import ERRORS, Name, Strict

router = Router(tags=["projects"])


class ProjectProvidersIn(Strict):
    providers: Annotated[list[Name], Field(max_length=1000)]


class ProjectProvidersOut(BaseModel):
    project: str
    # null: never granted, so every provider (the projects made before grants keep them all).
    providers: list[str] | None
    granted_at: datetime | None


def _project_for(token: ApiToken, name: str) -> Project:
    """The project ``name`` as ``token`` may see it: any for an operator, its own for a tenant
    (another answers as an unknown name does)."""
    found = Project.objects.filter(name=name).first() if name_storable(name) else None
    if found is None or not (token.operator or found.pk == token.project_id):
        raise NotFound(f"no project named {name!r}", data={"field": "name"})
    return found


def _grant_out(project: Project) -> dict[str, Any]:
    granted = project.providers_granted_at is not None
    names = sorted(project.granted_providers.values_list("name", flat=True)) if granted else None
    return {"project": project.name, "providers": names, "granted_at": project.providers_granted_at}


@router.get("/projects/{name}/providers", response={200: ProjectProvidersOut, **ERRORS})
def project_providers_get(request: HttpRequest, name: str) -> dict[str, Any]:
    return _grant_out(_project_for(request.auth, name))  # type: ignore[attr-defined]


@router.put(
    "/projects/{name}/providers",
    auth=OperatorTokenAuth(),  # a tenant's 403 comes before its body is judged
    response={200: ProjectProvidersOut, **ERRORS},
)
def project_providers_put(
    request: HttpRequest, name: str, payload: ProjectProvidersIn
) -> dict[str, Any]:
    token = require_operator(request)
    project = _project_for(token, name)
    services.project_providers_grant(
        project=project, names=payload.providers, actor=f"api:{token.name}"
    )
    project.refresh_from_db()
    return _grant_out(project)


# --- project limits (architecture.md §6.14) --------------------------------------------------


class ProjectLimitsOut(BaseModel):
    project: str
    # null: that one is not limited.
    requests_per_minute: int | None
    tokens_per_minute: int | None
    concurrent_calls: int | None
    set_at: datetime | None


class ProjectLimitsIn(Schema):
    """The body of ``PUT /projects/{name}/limits`` (read by hand: a 400 names the field)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_calls: int | None = None


def _limits_out(project: Project) -> dict[str, Any]:
    return {
        "project": project.name,
        **project_limits_of(project).as_dict(),
        "set_at": project.limits_set_at,
    }


@router.get(
    "/projects/{name}/limits", auth=OperatorTokenAuth(), response={200: ProjectLimitsOut, **ERRORS}
)
def project_limits_get(request: HttpRequest, name: str) -> dict[str, Any]:
    return _limits_out(_project_for(require_operator(request), name))


@router.put(
    "/projects/{name}/limits",
    auth=OperatorTokenAuth(),  # a tenant's 403 comes before its body is judged
    response={200: ProjectLimitsOut, **ERRORS},
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": ProjectLimitsIn.model_json_schema()}},
        }
    },
)
def project_limits_set(request: HttpRequest, name: str) -> dict[str, Any]:
    token = require_operator(request)
    project = _project_for(token, name)
    body = json_body(request, shape=LIMITS_SHAPE)
    check_fields(body, LIMIT_MAXIMA, shape=f"project limits {LIMITS_SHAPE}")
    project_limits_put(project=project, limits=check_limits(body), actor=f"api:{token.name}")
    project.refresh_from_db()
    return _limits_out(project)


@router.delete("/projects/{name}/limits", auth=OperatorTokenAuth(), response={204: None, **ERRORS})
def project_limits_delete(request: HttpRequest, name: str) -> Status:
    token = require_operator(request)
    project = _project_for(token, name)
    if not project_limits_clear(project=project, actor=f"api:{token.name}"):
        raise NotFound(f"project {name!r} has no limits", data={"field": "name"})
    return Status(204, None)
