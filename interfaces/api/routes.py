"""The HTTP API of API.md, v1. Thin: validate, call a service or selector, shape the answer."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, get_type_hints

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import NinjaAPI, Query, Schema, Status
from ninja.pagination import LimitOffsetPagination, paginate

from agentops import idempotency, services
from agentops.exceptions import ProviderFailed, bad_field
from agentops.models import ApiToken, HistoryRow, IdempotencyKey, Provider
from agentops.selectors import agent_for, history_row_out, provider_for, providers_granted
from interfaces import selectors as turn_selectors
from interfaces.api import errors
from interfaces.api.alerts_routes import router as alerts_router
from interfaces.api.auth import AsyncTokenAuth, OperatorTokenAuth, TokenAuth, require_operator
from interfaces.api.breaker_routes import router as breaker_router
from interfaces.api.projects_routes import router as projects_router
from interfaces.api.schemas import (
    ERRORS,
    AgentIn,
    AgentOut,
    AgentPatch,
    AgentStatus,
    CompleteIn,
    CompleteOut,
    ErrorOut,
    HealthOut,
    HistoryRowOut,
    Label,
    ProviderDetailOut,
    ProviderIn,
    ProviderOut,
    ToolResultsIn,
    TurnAccepted,
    TurnIn,
    TurnOut,
)
from interfaces.api.spend_routes import router as spend_router
from interfaces.api.waits_routes import router as waits_router
from interfaces.edge import runtime_of
from turns import services as turn_services
from turns.auxiliary import AuxMessage, auxiliary_complete_on_loop
from turns.runtime import TurnRuntime
from waits.limits import provider_limits

api = NinjaAPI(
    title="agentops",
    version="1",
    description=(
        "Runs LLM agents' model calls under progress bounds, durable provider waits "
        "and a poison-history breaker."
    ),
    auth=TokenAuth(),
    urls_namespace="api-v1",
)
errors.install(api)
api.add_router("/waits", waits_router, tags=["waits"])
api.add_router("/alerts", alerts_router, tags=["alerts"])
api.add_router("", breaker_router, tags=["breaker"])
api.add_router("", spend_router, tags=["spend"])
api.add_router("", projects_router, tags=["projects"])

# Every operation can answer 400 (a bad value), 401, 404 and 413 (a body over the limit).


def _token(request: HttpRequest) -> ApiToken:
    return request.auth  # type: ignore[attr-defined,no-any-return]


def _provider_out(p: Provider, *, operator: bool) -> dict[str, str | None]:
    # Where a provider points and which variable holds its key are for operators only.
    if not operator:
        return {"name": p.name, "kind": p.kind, "base_url": None, "api_key_env": None}
    # A provider that takes no key is stored with "" and answered with null, as it is posted.
    return {
        "name": p.name,
        "kind": p.kind,
        "base_url": p.base_url,
        "api_key_env": p.api_key_env or None,
    }


# --- providers ---------------------------------------------------------------


@api.post(
    "/providers",
    auth=OperatorTokenAuth(),  # a tenant's 403 comes before its body is judged
    response={201: ProviderOut, **ERRORS},
    tags=["providers"],
)
def provider_create(request: HttpRequest, payload: ProviderIn) -> Status:
    require_operator(request)
    provider = services.provider_create(
        name=payload.name,
        kind=payload.kind,
        base_url=payload.base_url,
        api_key_env=payload.api_key_env or "",
    )
    return Status(201, _provider_out(provider, operator=True))


@api.get("/providers", response={200: list[ProviderOut], **ERRORS}, tags=["providers"])
def provider_list(request: HttpRequest) -> list[dict[str, str | None]]:
    """Every provider to an operator; to a tenant, those granted to its project."""
    token = _token(request)
    found = (
        Provider.objects.all() if token.operator else providers_granted(project_id=token.project_id)
    )
    return [_provider_out(p, operator=token.operator) for p in found.order_by("name")]


@api.get("/providers/{name}", response={200: ProviderDetailOut, **ERRORS}, tags=["providers"])
def provider_read(request: HttpRequest, name: str) -> dict[str, Any]:
    token = _token(request)
    provider = provider_for(token=token, name=name)
    return {
        **_provider_out(provider, operator=token.operator),
        "limits": provider_limits(runtime_of(request).pacer, provider.name),
    }


# --- agents -------------------------------------------------------------------


@api.post("/agents", response={201: AgentOut, **ERRORS}, tags=["agents"])
def agent_create(request: HttpRequest, payload: AgentIn) -> Status:
    agent = services.agent_create(**payload.model_dump(), project_id=_token(request).project_id)
    return Status(201, turn_selectors.agent_out(runtime_of(request).pacer, agent))


class AgentsFilter(Schema):
    status: AgentStatus | None = None
    project: Label | None = None


def _annotations_resolved(func: Callable[..., Any]) -> Callable[..., Any]:
    """Resolve a view's annotations here: ``paginate`` wraps the view, and ninja would read
    the string annotations against the wrapper's module instead of this one."""
    func.__annotations__ = get_type_hints(func, include_extras=True)
    return func


@api.get("/agents", response={200: list[AgentOut], **ERRORS}, tags=["agents"])
@paginate(LimitOffsetPagination)
@_annotations_resolved
def agent_list(request: HttpRequest, filters: Query[AgentsFilter]) -> list[dict]:
    """Live agents the token may see, by name, with status, failure streak and holds;
    ``?status=`` keeps one status, ``?project=`` one project."""
    return turn_selectors.agents_out(
        runtime_of(request).pacer,
        token=_token(request),
        status=filters.status,
        project=filters.project,
    )


@api.get("/agents/{name}", response={200: AgentOut, **ERRORS}, tags=["agents"])
def agent_read(request: HttpRequest, name: str) -> dict:
    return turn_selectors.agent_out(
        runtime_of(request).pacer, agent_for(token=_token(request), name=name)
    )


@api.patch("/agents/{name}", response={200: AgentOut, **ERRORS}, tags=["agents"])
def agent_patch(request: HttpRequest, name: str, payload: AgentPatch) -> dict:
    agent = agent_for(token=_token(request), name=name)
    changes = payload.model_dump(exclude_unset=True)
    for field in ("model", "system", "fallbacks", "context_policy"):
        if field in changes and changes[field] is None:
            raise bad_field(field, "must not be null")
    services.agent_update(agent=agent, changes=changes)
    return turn_selectors.agent_out(
        runtime_of(request).pacer, agent_for(token=_token(request), name=name)
    )


@api.delete("/agents/{name}", response={204: None, **ERRORS}, tags=["agents"])
def agent_delete(request: HttpRequest, name: str) -> Status:
    token = _token(request)
    agent = agent_for(token=token, name=name)
    turn_services.agent_dispose(agent=agent, actor=f"api:{token.name}")
    return Status(204, None)


class HistoryFilter(Schema):
    include_set_aside: bool = False


@api.get("/agents/{name}/history", response={200: list[HistoryRowOut], **ERRORS}, tags=["agents"])
def agent_history(request: HttpRequest, name: str, filters: Query[HistoryFilter]) -> list[dict]:
    agent = agent_for(token=_token(request), name=name)
    rows = HistoryRow.objects.filter(agent=agent).order_by("seq")
    if not filters.include_set_aside:
        rows = rows.filter(state=HistoryRow.State.PRESENTED)
    return [history_row_out(r) for r in rows]


# --- turns --------------------------------------------------------------------


@api.post(
    "/agents/{name}/turns", response={202: TurnAccepted, 422: ErrorOut, **ERRORS}, tags=["turns"]
)
def turn_submit(request: HttpRequest, name: str, payload: TurnIn) -> Status | HttpResponse:
    """Queue a turn. With an ``Idempotency-Key`` header, a repeat answers the first turn
    (API.md, Idempotency-Key)."""
    agent = agent_for(token=_token(request), name=name)
    messages = [
        turn_services.IncomingMessage(participant=m.participant, content=m.content)
        for m in payload.messages
    ]
    key = idempotency.idempotency_key_check(request.headers.get(idempotency.HEADER))
    if key is None:
        turn, joined = turn_services.turn_submit(agent_id=agent.pk, messages=messages)
        return Status(202, {"id": turn.pk, "status": turn.status, "joined": joined})
    endpoint = f"POST /api/v1/agents/{agent.name}/turns"
    claim = idempotency.idempotency_key_claim(
        token_id=_token(request).pk,
        key=key,
        endpoint=endpoint,
        digest=idempotency.body_hash(endpoint=endpoint, body=request.body),
        agent=agent.name,
        now=timezone.now(),
    )
    if claim.kind == "replay":
        assert claim.row is not None
        return _replayed(claim.row)
    try:
        turn, joined = turn_services.turn_submit(agent_id=agent.pk, messages=messages)
    except BaseException:
        idempotency.idempotency_key_release(row_id=claim.row_id)  # refused: no turn was queued
        raise
    answer = {"id": turn.pk, "status": turn.status, "joined": joined}
    idempotency.idempotency_key_answer(
        row_id=claim.row_id,
        status=202,
        headers={"content-type": "application/json"},
        body=json.dumps(answer).encode(),
        turn_id=turn.pk,
    )
    return Status(202, answer)


def _replayed(row: IdempotencyKey) -> HttpResponse:
    """The answer recorded under a key, as a repeat of its request is given it."""
    replayed = HttpResponse(
        bytes(row.response_body or b""),
        status=row.response_status or 200,
        content_type="application/json",
    )
    replayed[idempotency.REPLAYED_HEADER] = "true"
    return replayed


@api.get("/turns/{turn_id}", response={200: TurnOut, **ERRORS}, tags=["turns"])
def turn_read(request: HttpRequest, turn_id: int) -> dict:
    return turn_selectors.turn_out(turn_selectors.turn_for(token=_token(request), turn_id=turn_id))


@api.post("/turns/{turn_id}/tool_results", response={202: TurnOut, **ERRORS}, tags=["turns"])
def turn_tool_results(request: HttpRequest, turn_id: int, payload: ToolResultsIn) -> Status:
    turn_selectors.turn_for(token=_token(request), turn_id=turn_id)
    turn_services.turn_tool_results(
        turn_id=turn_id, results=[r.model_dump() for r in payload.results]
    )
    return Status(202, turn_selectors.turn_out(turn_selectors.turn_get(turn_id=turn_id)))


@api.post("/turns/{turn_id}/cancel", response={200: TurnOut, **ERRORS}, tags=["turns"])
def turn_cancel(request: HttpRequest, turn_id: int) -> dict:
    turn_selectors.turn_for(token=_token(request), turn_id=turn_id)
    turn_services.turn_cancel(turn_id=turn_id)
    return turn_selectors.turn_out(turn_selectors.turn_get(turn_id=turn_id))


# --- auxiliary completion ---------------------------------------------------------


@api.post(
    "/agents/{name}/complete",
    auth=AsyncTokenAuth(),
    tags=["agents"],
    response={200: CompleteOut, 429: ErrorOut, 502: ErrorOut, 504: ErrorOut, **ERRORS},
)
async def agent_complete(
    request: HttpRequest, name: str, payload: CompleteIn
) -> dict | HttpResponse:
    """One auxiliary call. With an ``Idempotency-Key`` header, a repeat is answered from the
    first's record, with no provider call (API.md, Idempotency-Key)."""
    # Async, and the call runs on the request's own event loop: a long provider call holds no
    # thread and no database connection (each read or write gives its connection back).
    rt = runtime_of(request)  # what the call and its hops go through
    agent = await rt.db(agent_for, token=_token(request), name=name)
    messages = [AuxMessage(participant=m.participant, content=m.content) for m in payload.messages]

    async def complete() -> dict:
        done = await auxiliary_complete_on_loop(
            rt, agent=agent, messages=messages, model=payload.model, max_tokens=payload.max_tokens
        )
        return {**done, "call": turn_selectors.call_out(done["call"])}

    key = idempotency.idempotency_key_check(request.headers.get(idempotency.HEADER))
    if key is None:
        return await complete()
    return await _complete_once(rt, request, agent=agent.name, key=key, complete=complete)


async def _complete_once(
    rt: TurnRuntime,
    request: HttpRequest,
    *,
    agent: str,
    key: str,
    complete: Callable[[], Awaitable[dict]],
) -> HttpResponse:
    """``complete`` under a claimed key: the answer recorded after it, or the key released."""
    db = rt.db
    endpoint = f"POST /api/v1/agents/{agent}/complete"
    claim = await db(
        idempotency.idempotency_key_claim,
        token_id=_token(request).pk,
        key=key,
        endpoint=endpoint,
        digest=idempotency.body_hash(endpoint=endpoint, body=request.body),
        agent=agent,
        now=timezone.now(),
    )
    if claim.kind == "replay":
        assert claim.row is not None
        return _replayed(claim.row)
    try:
        answer = api.create_response(
            request, CompleteOut.model_validate(await complete()).model_dump(), status=200
        )
    except ProviderFailed as exc:
        if not idempotency.answer_kept(
            completed=False, provider_status=exc.data.get("http_status")
        ):
            await db(idempotency.idempotency_key_release, row_id=claim.row_id)
            raise
        # The provider refused the request itself: the same body would be refused again.
        answer = errors.error_response(api, request, exc.status, exc.code, exc.message, exc.data)
    except BaseException:
        # No answer (refused before the call, a transient failure, the client gone): a retry
        # under the key calls again.
        await db(idempotency.idempotency_key_release, row_id=claim.row_id)
        raise
    content = answer.content
    await db(
        idempotency.idempotency_key_answer,
        row_id=claim.row_id,
        status=answer.status_code,
        headers={"content-type": "application/json"},
        body=content if len(content) <= settings.AGENTOPS_IDEMPOTENCY_RECORD_BYTES else None,
    )
    return answer


# --- health -------------------------------------------------------------------


def health_payload() -> dict:
    import redis
    from django.conf import settings

    database = redis_ok = False
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        database = True
    except Exception:  # the answer is the health report, not an error
        database = False
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1)
    try:
        redis_ok = bool(client.ping())
        workers = len(client.keys("agentops:worker:*"))
    except redis.RedisError:
        redis_ok, workers = False, 0
    finally:
        client.close()
    readable = False
    if database:
        from waits.clock import clock_ms
        from waits.journal import journal_binding

        readable = journal_binding(now_ms=clock_ms()).readable
    ok = database and redis_ok and readable
    return {
        "status": "ok" if ok else "degraded",
        "database": database,
        "redis": redis_ok,
        "journal_readable": readable,
        "workers": workers,
    }


@api.get("/health", auth=None, response=HealthOut, tags=["health"])
def health(request: HttpRequest) -> dict:
    return health_payload()
