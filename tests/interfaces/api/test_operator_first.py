"""Operator-only endpoints authorize before they validate (issue 47, item 11): a tenant's token
gets the 403 the endpoint owes it whatever it sent, never a 400 judging a body or a query it
may not send at all, and nothing changes."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from agentops.models import Provider

pytestmark = pytest.mark.django_db

ASKS = [
    ("post", "/api/v1/providers", {"name": 1}),
    ("post", "/api/v1/providers", {"name": "p", "kind": "nonsense", "base_url": "x"}),
    ("get", "/api/v1/alerts?since=not-a-time", None),
    ("get", "/api/v1/waits?limit=-5", None),
    ("get", "/api/v1/waits/journal?since=not-a-time", None),
    ("post", "/api/v1/waits/release", {"agent": 1}),
    ("post", "/api/v1/alerts/not-a-number/acknowledge", None),
    ("post", "/api/v1/agents/a/history/not-a-number/restore", {"note": 5}),
]


@pytest.mark.parametrize(("method", "path", "body"), ASKS)
def test_a_tenant_gets_403_before_its_request_is_judged(
    user_token: str, method: str, path: str, body: object
) -> None:
    tenant = Client(headers={"Authorization": f"Bearer {user_token}"})
    kwargs = {"data": json.dumps(body), "content_type": "application/json"} if body else {}
    response = getattr(tenant, method)(path, **kwargs)
    assert response.status_code == 403, response.content
    assert "operator token" in response.json()["message"]
    assert not Provider.objects.exists()


def test_an_operator_still_gets_the_400_naming_the_field(api: Client) -> None:
    response = api.post(
        "/api/v1/providers", data=json.dumps({"name": 1}), content_type="application/json"
    )
    assert response.status_code == 400 and "name" in response.json()["message"]
