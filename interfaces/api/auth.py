from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja.security import HttpBearer

from agentops.exceptions import Forbidden
from agentops.models import ApiToken
from agentops.runtime import runtime
from agentops.tokens import api_token_check


class TokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        return api_token_check(token)


class AsyncTokenAuth(HttpBearer):
    """The same check for async operations, whose code runs on the event loop. The check's
    connection goes back to the pool at once: an async request may then wait on a provider
    for minutes without holding one."""

    async def authenticate(self, request: HttpRequest, token: str) -> Any:
        return await runtime().db(api_token_check, token)


def require_operator(request: HttpRequest) -> ApiToken:
    token: ApiToken = request.auth  # type: ignore[attr-defined]
    if not token.operator:
        raise Forbidden("this endpoint needs an operator token (create_api_token NAME --operator)")
    return token
