from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja.security import HttpBearer

from agentops.exceptions import Forbidden
from agentops.models import ApiToken
from agentops.tokens import api_token_check
from interfaces.edge import runtime_of

OPERATOR_NEEDED = "this endpoint needs an operator token (create_api_token NAME --operator)"


class TokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        return api_token_check(token)


class OperatorTokenAuth(TokenAuth):
    """An operator-only endpoint's check: a tenant's token gets its 403 here, before the body
    and query are validated (ninja validates after the auth), so what it sent is never judged
    and a 400 never tells it about an endpoint it may not use."""

    def authenticate(self, request: HttpRequest, token: str) -> Any:
        found = api_token_check(token)
        if found is not None and not found.operator:
            raise Forbidden(OPERATOR_NEEDED)
        return found


class AsyncTokenAuth(HttpBearer):
    """The same check for async operations, whose code runs on the event loop. The check's
    connection goes back to the pool at once: an async request may then wait on a provider
    for minutes without holding one."""

    async def authenticate(self, request: HttpRequest, token: str) -> Any:
        # The first code of an async request: the process's runtime reaches the database.
        return await runtime_of(request).db(api_token_check, token)


def require_operator(request: HttpRequest) -> ApiToken:
    token: ApiToken = request.auth  # type: ignore[attr-defined]
    if not token.operator:
        raise Forbidden(OPERATOR_NEEDED)
    return token
