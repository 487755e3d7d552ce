"""Logs say each decision once: a held turn re-checked and held again by the same wait writes
no new line; Celery's per-task "received"/"succeeded" lines are off."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from inference.models import Turn
from tests.factories import TurnFactory
from turns.moves import holds_logged, turn_hold

pytestmark = pytest.mark.django_db


def _running(turn: Turn) -> Turn:
    Turn.objects.filter(pk=turn.pk).update(
        status=Turn.Status.RUNNING, hold_until=None, hold_reason=""
    )
    turn.refresh_from_db()
    return turn


def test_a_re_check_that_holds_a_turn_by_the_same_wait_logs_nothing_new(
    caplog: pytest.LogCaptureFixture,
) -> None:
    turn = TurnFactory.create(agent__name="ada", status=Turn.Status.RUNNING)
    until = timezone.now() + timedelta(hours=2)
    caplog.set_level(logging.INFO, logger="turns.services")
    logged = holds_logged()  # the process's, as its re-checks keep it
    reason = "provider wait on m1: 429"
    for _ in range(5):  # the drain's re-checks: claimed (running), then held again
        assert turn_hold(turn=_running(turn), until=until, reason=reason, logged=logged)
    later = until + timedelta(minutes=5)
    assert turn_hold(turn=_running(turn), until=later, reason=reason, logged=logged)
    lines = [r.getMessage() for r in caplog.records if "held until" in r.getMessage()]
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"agent ada turn {turn.pk} held until ")


def test_celerys_per_task_lines_are_off() -> None:
    loggers: Any = settings.LOGGING["loggers"]  # type: ignore[index]
    assert loggers["celery.app.trace"]["level"] == "WARNING"
    assert loggers["celery.worker.strategy"]["level"] == "WARNING"
