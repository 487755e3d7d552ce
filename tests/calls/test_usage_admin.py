"""A call's token usage in the admin: the counts reported, and '-' (never 0) for one not."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from tests.factories import AgentFactory, CallFactory

pytestmark = pytest.mark.django_db


def admin() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x"))
    return client


def test_the_calls_list_and_page_show_the_reported_tokens_and_dashes_for_none() -> None:
    agent = AgentFactory.create()
    counted = CallFactory.create(
        agent=agent,
        kind="auxiliary",
        model="m1",
        streamed=False,
        outcome="completed",
        input_tokens=1234,
        output_tokens=56,
        reasoning_tokens=7,
        cached_input_tokens=1000,
    )
    CallFactory.create(agent=agent, kind="auxiliary", model="m2", streamed=False, outcome="cut")
    client = admin()
    listing = client.get("/admin/inference/inferencecall/").content.decode()
    assert "1234 / 56" in listing and "- / -" in listing and "0 / 0" not in listing
    page = client.get(f"/admin/inference/inferencecall/{counted.pk}/change/").content.decode()
    assert "Token usage" in page
    for label, value in (
        ("Input tokens", "1234"),
        ("Output tokens", "56"),
        ("Reasoning tokens", "7"),
        ("Cached input tokens", "1000"),
    ):
        assert label in page and f'<div class="readonly">{value}</div>' in page
