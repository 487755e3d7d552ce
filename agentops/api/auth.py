from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpRequest
from ninja.security import HttpBearer

from agentops.exceptions import Forbidden
from agentops.models import ApiToken
from agentops.tokens import api_token_check


class TokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str) -> Any:
        return api_token_check(token)


class AsyncTokenAuth(HttpBearer):
    """The same check for async operations, whose code runs on the event loop."""

    async def authenticate(self, request: HttpRequest, token: str) -> Any:
        return await sync_to_async(api_token_check)(token)


def require_operator(request: HttpRequest) -> ApiToken:
    token: ApiToken = request.auth  # type: ignore[attr-defined]
    if not token.operator:
        raise Forbidden("this endpoint needs an operator token (create_api_token NAME --operator)")
    return token
