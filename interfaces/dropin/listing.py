"""``GET /v1/models`` and ``GET /v1/models/{id}`` (architecture.md §14): the agents a drop-in client may
call, as the asking SDK lists models, so tools that discover models that way (IDE plugins,
chat UIs, ``client.models.list()``) find them.

A model's id is an agent's name. A request is Anthropic's when it carries ``anthropic-version``
or ``x-api-key`` (as the Anthropic SDK sends), and then lists the agents the messages endpoint
serves, in Anthropic's shape (``limit``, ``after_id`` and ``before_id`` page it); otherwise the
agents of the two OpenAI endpoints, in OpenAI's. A token sees the agents ``GET /agents`` shows
it: a non-operator token never another project's.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from agentops.models import Agent, ApiToken, Provider
from agentops.selectors import visible_to
from agentops.tokens import api_token_check
from interfaces.dropin.formats import ANTHROPIC, OPENAI, Format, error

ANTHROPIC_KINDS = (Provider.Kind.ANTHROPIC,)
OPENAI_KINDS = (Provider.Kind.OPENAI, Provider.Kind.OPENAI_RESPONSES)
# Anthropic's list: 20 a page unless ``limit`` says otherwise, 1,000 at most.
PAGE_DEFAULT, PAGE_MAX = 20, 1000


def asked_format(request: HttpRequest) -> Format:
    headers = request.headers
    return ANTHROPIC if "anthropic-version" in headers or "x-api-key" in headers else OPENAI


def agents_listed(token: ApiToken, fmt: Format) -> list[Agent]:
    """The live agents ``token`` sees whose provider speaks ``fmt``'s family, by name."""
    kinds = ANTHROPIC_KINDS if fmt is ANTHROPIC else OPENAI_KINDS
    found = Agent.objects.select_related("project").filter(
        disposed_at__isnull=True, provider__kind__in=kinds
    )
    if not token.operator:
        found = found.filter(project_id=token.project_id)
    return list(found.order_by("name"))


def agent_listed(token: ApiToken, fmt: Format, name: str) -> Agent | None:
    kinds = ANTHROPIC_KINDS if fmt is ANTHROPIC else OPENAI_KINDS
    agent = (
        Agent.objects.select_related("project")
        .filter(disposed_at__isnull=True, provider__kind__in=kinds, name=name)
        .first()
    )
    return agent if agent is not None and visible_to(token, agent) else None


def model_object(agent: Agent, fmt: Format) -> dict[str, Any]:
    if fmt is ANTHROPIC:
        created = agent.created_at.isoformat().replace("+00:00", "Z")
        return {
            "type": "model",
            "id": agent.name,
            "display_name": agent.name,
            "created_at": created,
        }
    return {
        "id": agent.name,
        "object": "model",
        "created": int(agent.created_at.timestamp()),
        "owned_by": agent.project.name,
    }


def models_page(request: HttpRequest, token: ApiToken, fmt: Format) -> tuple[int, dict[str, Any]]:
    """The list in ``fmt``'s shape, or a 400's status and error fields (a bad ``limit``)."""
    agents = agents_listed(token, fmt)
    if fmt is not ANTHROPIC:
        return 200, {"object": "list", "data": [model_object(a, fmt) for a in agents]}
    raw_limit = request.GET.get("limit", str(PAGE_DEFAULT))
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= PAGE_MAX:
        return 400, {
            "message": f"limit: must be a whole number from 1 to {PAGE_MAX}",
            "param": "limit",
        }
    limit = int(raw_limit)
    after, before = request.GET.get("after_id"), request.GET.get("before_id")
    if before is not None:
        earlier = [a for a in agents if a.name < before]
        page, more = earlier[-limit:], len(earlier) > limit
    else:
        later = [a for a in agents if after is None or a.name > after]
        page, more = later[:limit], len(later) > limit
    data = [model_object(a, fmt) for a in page]
    return 200, {
        "data": data,
        "has_more": more,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def models_response(request: HttpRequest, token_text: str, model_id: str | None) -> HttpResponse:
    """The whole answer of ``GET /v1/models[/{id}]``, in the asking SDK's shape. Blocking."""
    fmt = asked_format(request)
    token = api_token_check(token_text) if token_text else None
    if token is None:
        return error(
            fmt,
            401,
            "a valid agentops API token is required as the API key (Authorization: Bearer <token> or x-api-key: <token>)",
        )
    if model_id is None:
        status, body = models_page(request, token, fmt)
        if status != 200:
            return error(fmt, status, body["message"], extra={"param": body["param"]})
        return JsonResponse(body)
    agent = agent_listed(token, fmt, model_id)
    if agent is None:
        return error(
            fmt,
            404,
            f"model: no agent named {model_id[:200]!r} that this endpoint serves",
            code="model_not_found" if fmt is OPENAI else None,
            extra={"param": "model"},
        )
    return JsonResponse(model_object(agent, fmt))
