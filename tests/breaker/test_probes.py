"""The probe's life on the breaker's side (DESIGN §7.3), on real Postgres: what counts as a
move while it is out, its verdicts and their alerts, the shed under the move check's locks,
and withdrawing it."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from agentops.models import Agent, Alert, HistoryRow
from breaker.models import BreakerState
from breaker.probes import breaker_probe_moved
from breaker.services import breaker_note_success
from inference.models import Turn
from tests.breaker.common import end, fail, probe_out, row, state

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("breaker_settings")]


def test_a_probe_with_nothing_moved_is_answered(agent: Agent) -> None:
    ticket = probe_out(agent)
    assert breaker_probe_moved(ticket=ticket) is None
    assert state(agent).probe_status == "out"
    assert end(ticket, "answered", "answered: ok").status == "answered"
    assert state(agent).probe_status == "answered"
    assert not Alert.objects.filter(kind="history-kept").exists()


def _add_row(agent: Agent) -> None:
    row(agent, content="meanwhile")


def _edit_row(agent: Agent) -> None:
    HistoryRow.objects.filter(agent=agent, seq=1).update(content="edited", edited_at=timezone.now())


def _set_aside_row(agent: Agent) -> None:
    HistoryRow.objects.filter(agent=agent, seq=1).update(state=HistoryRow.State.SET_ASIDE, set_aside_at=timezone.now(), set_aside_by="admin:x")


def _streak_moved_and_back(agent: Agent) -> None:
    # Without withdrawing the probe: only the version tells the streak moved and came back.
    BreakerState.objects.filter(agent=agent).update(streak_version=state(agent).streak_version + 2)


def _another_turn(agent: Agent) -> None:
    Turn.objects.create(agent=agent)


def _disposed(agent: Agent) -> None:
    Agent.objects.filter(pk=agent.pk).update(disposed_at=timezone.now())


def _success(agent: Agent) -> None:
    breaker_note_success(agent=agent)


def _failure(agent: Agent) -> None:
    fail(agent)


@pytest.mark.parametrize(
    ("move", "reason"),
    [
        (_add_row, "added"),
        (_edit_row, "edited"),
        (_set_aside_row, "set aside"),
        (_streak_moved_and_back, "streak changed"),
        (_another_turn, "another turn"),
        (_disposed, "disposed"),
        (_success, "withdrawn"),
        (_failure, "withdrawn"),
    ],
)
def test_anything_that_moves_while_the_probe_is_out_sets_its_answer_aside(agent: Agent, move: Any, reason: str) -> None:
    ticket = probe_out(agent)
    move(agent)
    moved = breaker_probe_moved(ticket=ticket)
    assert moved is not None and reason in moved
    status = end(ticket, "answered", "answered: ok").status
    assert status in ("set_aside", "withdrawn")
    assert HistoryRow.objects.filter(agent=agent, set_aside_by="breaker").count() == 0
    assert not Alert.objects.filter(kind="history-kept").exists()


def test_a_streak_that_moves_and_comes_back_sets_the_answer_aside_through_the_real_services(agent: Agent) -> None:
    ticket = probe_out(agent)
    streak = state(agent).streak
    breaker_note_success(agent=agent)
    for _ in range(streak):
        fail(agent)
    assert state(agent).streak == streak
    assert breaker_probe_moved(ticket=ticket) is not None


def test_a_removed_agent_moves_the_probe(agent: Agent) -> None:
    ticket = probe_out(agent)
    BreakerState.objects.filter(agent=agent).delete()
    assert breaker_probe_moved(ticket=ticket) == "the agent was removed"


def test_a_refused_probe_keeps_the_history_and_says_so_in_a_history_kept_alert(agent: Agent) -> None:
    ticket = probe_out(agent)
    assert end(ticket, "refused", "invalid_request at HTTP 400").status == "refused"
    alert = Alert.objects.get(kind="history-kept")
    assert alert.verdict == "refused"
    assert "fails without its history too" in alert.message and "none of the history was shed" in alert.message
    assert "No retry was queued" in alert.message and "next wakes it" in alert.message
    assert HistoryRow.objects.filter(agent=agent, state=HistoryRow.State.SET_ASIDE).count() == 0
    assert state(agent).probe_verdict == "invalid_request at HTTP 400"


def test_an_unclear_probe_raises_a_history_kept_alert_under_its_own_verdict(agent: Agent) -> None:
    ticket = probe_out(agent)
    assert end(ticket, "unclear", "rate_limit at HTTP 429").status == "unclear"
    alert = Alert.objects.get(kind="history-kept")
    assert alert.verdict == "unclear"
    assert "couldn't tell whether the history is the cause" in alert.message
    assert "Nothing was shed and no retry was queued" in alert.message


