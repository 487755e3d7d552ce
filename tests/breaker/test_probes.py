"""The probe's life on the breaker's side (architecture.md §7.3), on real Postgres: what counts as a
move while it is out, its verdicts and their alerts, the shed under the move check's locks,
and withdrawing it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from agentops.models import Agent, Alert, HistoryRow
from agentops.services import history_append
from breaker.models import BreakerState
from breaker.probes import ProbeEnd, ProbeTicket, breaker_probe_begin, breaker_probe_moved
from breaker.services import breaker_note_success, breaker_probe_withdraw, probe_abort_key
from inference.models import Turn
from tests.breaker.common import end, fail, probe_out, row, state
from tests.factories import TurnFactory
from turns.services import agent_dispose

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("breaker_settings")]


def test_a_probe_with_nothing_moved_is_answered_and_sheds_the_newest_turn_at_once(
    agent: Agent,
) -> None:
    ticket = probe_out(agent)
    assert breaker_probe_moved(ticket=ticket) is None
    assert state(agent).probe_status == "out"
    ended = end(ticket, "answered", "answered: ok")
    assert ended.status == "answered"
    assert ended.shed is not None and ended.shed.stopped is None
    assert [r.content for r in ended.shed.rows] == ["two"]
    assert state(agent).probe_status == "answered" and state(agent).sheds_this_run == 1
    assert not Alert.objects.filter(kind="history-kept").exists()


def _add_row(agent: Agent) -> None:
    row(agent, content="meanwhile")


def _edit_row(agent: Agent) -> None:
    HistoryRow.objects.filter(agent=agent, seq=1).update(content="edited", edited_at=timezone.now())


def _set_aside_row(agent: Agent) -> None:
    HistoryRow.objects.filter(agent=agent, seq=1).update(
        state=HistoryRow.State.SET_ASIDE, set_aside_at=timezone.now(), set_aside_by="admin:x"
    )


def _streak_moved_and_back(agent: Agent) -> None:
    # Without withdrawing the probe: only the version tells the streak moved and came back.
    BreakerState.objects.filter(agent=agent).update(streak_version=state(agent).streak_version + 2)


def _another_turn(agent: Agent) -> None:
    TurnFactory.create(agent=agent)


def _turn_claimed(agent: Agent) -> None:
    # A turn that already existed, claimed again (a resumed or re-armed turn runs).
    Turn.objects.filter(agent=agent).update(attempts=F("attempts") + 1)


def _replaced(agent: Agent) -> None:
    Agent.objects.filter(pk=agent.pk).update(model="another-model")


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
        (_turn_claimed, "another turn"),
        (_replaced, "replaced"),
        (_disposed, "disposed"),
        (_success, "withdrawn"),
        (_failure, "withdrawn"),
    ],
)
def test_anything_that_moves_while_the_probe_is_out_sets_its_answer_aside(
    agent: Agent, move: Any, reason: str
) -> None:
    ticket = probe_out(agent)
    move(agent)
    moved = breaker_probe_moved(ticket=ticket)
    assert moved is not None and reason in moved
    status = end(ticket, "answered", "answered: ok").status
    assert status in ("set_aside", "withdrawn")
    assert HistoryRow.objects.filter(agent=agent, set_aside_by="breaker").count() == 0
    assert not Alert.objects.filter(kind="history-kept").exists()


def test_a_streak_that_moves_and_comes_back_sets_the_answer_aside_through_the_real_services(
    agent: Agent,
) -> None:
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


def test_a_refused_probe_keeps_the_history_and_says_so_in_a_history_kept_alert(
    agent: Agent,
) -> None:
    ticket = probe_out(agent)
    assert end(ticket, "refused", "invalid_request at HTTP 400").status == "refused"
    alert = Alert.objects.get(kind="history-kept")
    assert alert.verdict == "refused"
    assert (
        "fails without its history too" in alert.message
        and "none of the history was shed" in alert.message
    )
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


def test_an_aborted_probe_raises_the_couldnt_tell_alert_and_sheds_nothing(agent: Agent) -> None:
    ticket = probe_out(agent)
    ended = end(ticket, "aborted", "aborted: the service is stopping")
    assert ended.status == "aborted" and ended.shed is None
    alert = Alert.objects.get(kind="history-kept")
    assert alert.verdict == "unclear" and "couldn't tell" in alert.message
    assert state(agent).probe_status == "aborted" and state(agent).sheds_this_run == 0
    assert not HistoryRow.objects.filter(agent=agent, state=HistoryRow.State.SET_ASIDE).exists()


def test_each_history_kept_verdict_carries_its_own_verdict_for_its_webhook_cooldown(
    agent: Agent,
) -> None:
    end(probe_out(agent), "refused", "invalid_request at HTTP 400")
    fail(agent)  # the next failure of the run probes again
    end(breaker_probe_begin(agent=agent), "unclear", "rate_limit at HTTP 429")
    fail(agent)
    end(breaker_probe_begin(agent=agent), "aborted", "aborted: the service is stopping")
    verdicts = list(
        Alert.objects.filter(kind="history-kept", agent=agent.name)
        .order_by("id")
        .values_list("verdict", flat=True)
    )
    assert verdicts == ["refused", "unclear", "unclear"]
    assert set(Alert.objects.filter(kind="hard-down").values_list("verdict", flat=True)) == {
        ""
    }  # one key per agent (§7.1)


# Withdrawing (§7.3: a later failure, a completed call, the agent's removal)


def abort_signalled(ticket: ProbeTicket) -> bool:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return bool(client.exists(probe_abort_key(ticket.probe_id)))
    finally:
        client.close()


@pytest.mark.parametrize(
    "withdraw",
    [
        lambda agent: fail(agent),
        lambda agent: breaker_note_success(agent=agent),
        lambda agent: breaker_probe_withdraw(
            agent=agent, reason="the agent was removed while it was out"
        ),
    ],
    ids=["a later failure", "a completed call", "the agent's removal"],
)
@pytest.mark.django_db(transaction=True)
def test_a_withdrawn_probe_is_marked_and_its_call_is_told_to_abort(
    agent: Agent, withdraw: Any
) -> None:
    ticket = probe_out(agent)
    assert not abort_signalled(ticket)
    withdraw(agent)
    assert state(agent).probe_status == "withdrawn"
    assert abort_signalled(ticket)  # on commit
    ended = end(ticket, "answered")
    assert ended.status == "withdrawn" and ended.shed is None
    assert not HistoryRow.objects.filter(agent=agent, state=HistoryRow.State.SET_ASIDE).exists()


def test_disposing_the_agent_withdraws_its_probe(agent: Agent) -> None:
    Agent.objects.filter(pk=agent.pk).update(kind=Agent.Kind.CONVERSATION)
    agent.refresh_from_db()
    ticket = probe_out(agent)
    agent_dispose(agent=agent, actor="test")
    assert state(agent).probe_status == "withdrawn"
    assert "the agent was removed" in state(agent).probe_verdict
    assert end(ticket, "answered").status == "withdrawn"


def test_withdrawing_when_no_probe_is_out_changes_nothing(agent: Agent) -> None:
    ticket = probe_out(agent)
    end(ticket, "refused", "invalid_request at HTTP 400")
    assert breaker_probe_withdraw(agent=agent, reason="x") is False
    assert state(agent).probe_status == "refused"


# No window between the move check and the shed


@pytest.mark.django_db(transaction=True)
def test_a_message_stored_while_the_answer_is_read_is_never_shed_over(agent: Agent) -> None:
    """A history writer holding the agent's lock makes the probe's end wait for it and then see
    the move; the shed never runs between a check that saw nothing and the writer's commit."""
    ticket = probe_out(agent)
    writing = threading.Event()
    release = threading.Event()
    ended: list[Any] = []

    def writer() -> None:
        try:
            with transaction.atomic():
                Agent.objects.select_for_update().get(pk=agent.pk)
                history_append(
                    agent=agent, participant="bob", role=HistoryRow.Role.USER, content="meanwhile"
                )
                writing.set()
                release.wait(10)
        finally:
            connection.close()

    def reader() -> None:
        try:
            ended.append(end(ticket, "answered"))
        except Exception as exc:  # reported below, with what it was
            ended.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    threads[0].start()
    assert writing.wait(10)
    threads[1].start()
    threads[1].join(0.5)
    assert threads[1].is_alive(), "the probe's end must wait for the history writer's lock"
    release.set()
    for t in threads:
        t.join(10)
    assert isinstance(ended[0], ProbeEnd), ended
    assert ended[0].status == "set_aside" and ended[0].shed is None
    assert not HistoryRow.objects.filter(agent=agent, state=HistoryRow.State.SET_ASIDE).exists()
    assert HistoryRow.objects.filter(
        agent=agent, content="meanwhile", state=HistoryRow.State.PRESENTED
    ).exists()
