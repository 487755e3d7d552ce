"""A queued turn shows no hold (issue 47, item 2): a hold's until and reason belong to a held
turn. A re-armed turn waits in the queue with its reason as its waiting reason, and the turn's
API and admin page say no "Hold reason: re-armed after network" for it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from calls.types import ProviderError
from inference.models import Turn
from tests.factories import TurnFactory
from turns.moves import holds_logged, turn_hold, turn_rearm
from turns.services import turn_move

pytestmark = pytest.mark.django_db


def test_a_re_armed_turn_is_queued_with_a_waiting_reason_and_no_hold_reason(api: Client) -> None:
    turn = TurnFactory.create(agent__name="ada", status=Turn.Status.RUNNING)
    assert turn_hold(
        turn=turn,
        until=timezone.now() + timedelta(hours=1),
        reason="provider wait",
        logged=holds_logged(),
    )
    Turn.objects.filter(pk=turn.pk).update(status=Turn.Status.RUNNING)  # claimed again
    turn.refresh_from_db()
    assert turn_rearm(turn=turn, error=ProviderError(type="network", message="gone"))
    shown = api.get(f"/api/v1/turns/{turn.pk}").json()
    assert shown["status"] == "queued"
    assert (shown["held_until"], shown["hold_reason"]) == (None, "")
    assert shown["waiting_reason"].startswith("re-armed after network (1 of ")
    User.objects.create_superuser("olga", password="a long operator password")
    admin = Client()
    admin.login(username="olga", password="a long operator password")
    page = admin.get(f"/admin/inference/turn/{turn.pk}/change/").content.decode()
    assert "re-armed after network" in page and "provider wait" not in page


def test_a_held_turn_cancelled_keeps_no_hold(api: Client) -> None:
    turn = TurnFactory.create(agent__name="bob", status=Turn.Status.RUNNING)
    assert turn_hold(
        turn=turn,
        until=timezone.now() + timedelta(hours=1),
        reason="provider wait",
        logged=holds_logged(),
    )
    assert turn_move(turn.pk, Turn.Status.CANCELLED)
    shown = api.get(f"/api/v1/turns/{turn.pk}").json()
    assert (shown["status"], shown["held_until"], shown["hold_reason"]) == ("cancelled", None, "")
