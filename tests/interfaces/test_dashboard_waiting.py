"""The dashboard's snapshot lists the turns whose next call waits, with why and until when
(issue 13, item 3), and the admin's turn page says so too."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from inference.models import Turn
from interfaces.dashboard import dashboard_snapshot
from tests.factories import AgentFactory, TurnFactory
from turns.runtime import TurnRuntime


@pytest.mark.django_db
def test_the_snapshot_and_the_admin_show_a_turn_waiting_for_its_pacing(
    runtime: TurnRuntime,
) -> None:
    agent = AgentFactory.create(name="pacey")
    until = timezone.now() + timedelta(seconds=40)
    waiting = TurnFactory.create(
        agent=agent,
        status=Turn.Status.RUNNING,
        not_before=until,
        waiting_reason="pacing after a 429",
    )
    TurnFactory.create(
        agent=agent,
        status=Turn.Status.SUCCEEDED,
        not_before=until,
        waiting_reason="pacing after a 429",
    )  # ended: no wait
    TurnFactory.create(
        agent=agent,
        status=Turn.Status.QUEUED,
        not_before=timezone.now() - timedelta(seconds=1),
        waiting_reason="re-armed",
    )  # over

    snapshot = dashboard_snapshot(runtime.pacer, now_ms=time.time() * 1000)
    assert snapshot["waiting"] == [
        {
            "turn": waiting.pk,
            "agent": "pacey",
            "status": "running",
            "waiting_until_ms": until.timestamp() * 1000,
            "waiting_reason": "pacing after a 429",
        },
    ]

    admin = User.objects.create_superuser("op", "op@example.com", "pw")
    client = Client()
    client.force_login(admin)
    page = client.get(f"/admin/inference/turn/{waiting.pk}/change/")
    assert page.status_code == 200
    assert f"until {until:%Y-%m-%d %H:%M:%S} UTC: pacing after a 429" in page.content.decode()
