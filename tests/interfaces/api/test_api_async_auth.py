"""Token auth on the async ``complete`` endpoint, through Django's AsyncClient (the ASGI path).

How the header is passed matters with AsyncClient (Django 5.2): ``AsyncClient(headers=...)`` in
the constructor stores the header under its WSGI name (``HTTP_AUTHORIZATION``), which the async
request factory then sends as an ASGI header literally named ``http-authorization``; the view sees
no ``Authorization`` and answers 401. The same goes for ``HTTP_AUTHORIZATION=`` as a request's
extra keyword. A per-request ``headers={"Authorization": ...}`` (used here) arrives as sent.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient
from django.utils import timezone

from agentops.models import Agent, ApiToken

pytestmark = [pytest.mark.django_db(transaction=True)]

UNAUTHORIZED = {
    "code": "unauthorized",
    "message": "a valid API token is required: Authorization: Bearer <token>",
    "data": {},
}


@pytest.fixture
def agent(make_agent: Any) -> Agent:
    agent: Agent = make_agent()
    return agent


async def complete(agent: Agent, *, authorization: str | None) -> Any:
    headers = {"Authorization": authorization} if authorization is not None else {}
    body = {"messages": [{"participant": "alice", "content": "summarise"}]}
    return await AsyncClient().post(
        f"/api/v1/agents/{agent.name}/complete",
        data=json.dumps(body),
        content_type="application/json",
        headers=headers,
    )


async def test_a_valid_token_through_the_async_client_gets_the_completion(
    agent: Agent, user_token: str
) -> None:
    response = await complete(agent, authorization=f"Bearer {user_token}")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["content"] == "Stand-in answer to: alice: summarise"
    assert body["call"]["kind"] == "auxiliary" and body["call"]["outcome"] == "completed"
    # The check ran (in a thread, off the event loop) and recorded the token's use.
    token = await ApiToken.objects.aget(name="test-user")
    assert token.last_used_at is not None


async def test_no_token_through_the_async_client_is_a_401(agent: Agent) -> None:
    response = await complete(agent, authorization=None)
    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED


@pytest.mark.parametrize(
    "authorization", ["Bearer ao_not-a-real-token", "Basic dXNlcjpwYXNz", "Bearer "]
)
async def test_a_wrong_token_through_the_async_client_is_a_401(
    agent: Agent, authorization: str
) -> None:
    response = await complete(agent, authorization=authorization)
    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED


async def test_a_revoked_token_through_the_async_client_is_a_401(
    agent: Agent, user_token: str
) -> None:
    assert (await complete(agent, authorization=f"Bearer {user_token}")).status_code == 200
    await sync_to_async(ApiToken.objects.filter(name="test-user").update)(revoked_at=timezone.now())
    response = await complete(agent, authorization=f"Bearer {user_token}")
    assert response.status_code == 401
    assert response.json() == UNAUTHORIZED
