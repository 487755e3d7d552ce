"""A provider's error that the drop-in relays is the provider's (issue 47, item 8): Django logs
no "Internal Server Error: /v1/chat/completions" of its own for it; the call's row has it."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.test import Client

from inference.models import InferenceCall

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("status", [500, 503, 400])
def test_a_relayed_provider_error_is_not_logged_as_the_services_own(
    user_token: str, make_agent: Any, caplog: pytest.LogCaptureFixture, status: int
) -> None:
    agent = make_agent(model=f"error:status={status}")
    caplog.set_level(logging.INFO, logger="django.request")
    response = Client(headers={"Authorization": f"Bearer {user_token}"}).post(
        "/v1/chat/completions",
        data=json.dumps({"model": agent.name, "messages": [{"role": "user", "content": "hi"}]}),
        content_type="application/json",
    )
    assert response.status_code == status
    assert [r.getMessage() for r in caplog.records if r.name == "django.request"] == []
    # A 5xx is called again once before it is relayed (architecture.md §14.1): a row each.
    calls = list(InferenceCall.objects.filter(agent=agent))
    assert len(calls) == (2 if status >= 500 else 1)
    assert all(c.outcome == "error" and (c.error or {})["http_status"] == status for c in calls)
