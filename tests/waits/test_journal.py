"""Durable, pending and binding (architecture.md §6.4) and unreadable records (§6.5), on real
PostgreSQL."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from agentops.models import Agent, Alert, AuditEntry
from tests.conftest import wait_for
from tests.factories import AgentFactory
from waits.admission import Hold, admission_check, remaining_ms
from waits.clock import clock_ms
from waits.core import MAX_INSTANT_MS
from waits.journal import JOURNAL_POLL_MS, journal_pending
from waits.models import WaitJournalEntry
from waits.services import journal_checkpoint, wait_record, wait_release

from .conftest import NOW, insert_row, manage, restart, run_in_another_process

pytestmark = pytest.mark.django_db
RECHECK = settings.AGENTOPS_WAIT_RECHECK_MS


def held(agent: Agent, model: str, now_ms: float = NOW) -> Hold | None:
    return admission_check(agent=agent, model=model, now_ms=now_ms)


def framework_alerts() -> int:
    return Alert.objects.filter(kind="provider-wait", agent="framework", model="*").count()


# --- durability -----------------------------------------------------------------------------


def test_a_recorded_wait_survives_a_restart_and_binds_until_its_deadline(agent: Agent) -> None:
    result = wait_record(
        agent=agent, model="m1", retry_after_ms=600_000, reason="429 slow down", now_ms=NOW
    )
    assert (result.binding, result.until_ms, result.changed, result.receipt) == (
        True,
        NOW + 600_000,
        True,
        "recorded",
    )
    restart()
    hold = held(agent, "m1", NOW + 600_000 - 1)
    assert (
        hold is not None
        and hold.source == "recorded"
        and hold.until_ms == NOW + 600_000
        and hold.reason == "429 slow down"
    )
    assert remaining_ms(hold, NOW + 600_000 - 1) == 1
    assert held(agent, "m1", NOW + 600_000) is None
    assert held(agent, "m2", NOW) is None  # another model proceeds


def test_a_release_survives_a_restart(agent: Agent) -> None:
    wait_record(
        agent=agent, model="m1", retry_after_ms=float("nan"), reason="until released", now_ms=NOW
    )
    wait_record(agent=agent, model="m2", retry_after_ms=600_000, reason="429", now_ms=NOW)
    restart()
    hold = held(agent, "m1")
    assert hold is not None and hold.until_ms is None
    wait_release(
        agent="ada",
        model="m1",
        reason="provider says ok",
        via="api",
        requester="ops",
        now_ms=NOW + 10,
    )
    restart()
    assert held(agent, "m1", NOW + 20) is None
    assert held(agent, "m2", NOW + 20) is not None


def test_a_shorter_wait_after_a_restart_changes_nothing_and_says_so(agent: Agent) -> None:
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="first", now_ms=NOW)
    restart()
    result = wait_record(
        agent=agent, model="m1", retry_after_ms=1000, reason="second", now_ms=NOW + 1
    )
    assert (result.binding, result.until_ms, result.changed) == (True, NOW + 600_000, False)


def test_a_negative_wait_over_a_600_s_wait_records_nothing_and_leaves_it(agent: Agent) -> None:
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="first", now_ms=NOW)
    rows = WaitJournalEntry.objects.count()
    result = wait_record(
        agent=agent, model="m1", retry_after_ms=-1, reason="retry now", now_ms=NOW + 1000
    )
    assert (result.binding, result.until_ms, result.changed, result.receipt) == (
        True,
        NOW + 600_000,
        False,
        "none",
    )
    assert WaitJournalEntry.objects.count() == rows
    restart()
    assert held(agent, "m1", NOW + 1000).until_ms == NOW + 600_000  # type: ignore[union-attr]


@pytest.mark.parametrize("stated", [-1, -1000, 0])
def test_a_wait_already_over_binds_nothing_before_or_after_a_restart(
    agent: Agent, stated: float
) -> None:
    result = wait_record(
        agent=agent, model="m1", retry_after_ms=stated, reason="retry now", now_ms=NOW
    )
    assert (result.binding, result.receipt) == (False, "none")
    assert held(agent, "m1") is None
    restart()
    assert held(agent, "m1") is None
    assert not WaitJournalEntry.objects.exists()


def test_an_ephemeral_agent_records_nothing_and_is_never_held(db: None) -> None:
    run: Agent = AgentFactory.create(kind=Agent.Kind.EPHEMERAL)
    result = wait_record(agent=run, model="m1", retry_after_ms=7_200_000, reason="429", now_ms=NOW)
    assert (result.binding, result.receipt) == (False, "none")
    assert not WaitJournalEntry.objects.exists()
    insert_row(kind="bogus")
    restart()
    assert held(run, "m1") is None  # not held by unreadable records either


@pytest.mark.django_db(transaction=True)
def test_a_separate_process_reads_the_same_binding_state(agent: Agent) -> None:
    wait_record(
        agent=agent, model="m1", retry_after_ms=float("inf"), reason="until released", now_ms=NOW
    )
    wait_record(agent=agent, model="m2", retry_after_ms=600_000, reason="429", now_ms=NOW)
    wait_record(agent=agent, model="m3", retry_after_ms=600_000, reason="429", now_ms=NOW)
    wait_release(agent="ada", model="m3", reason="ok", via="api", requester="ops", now_ms=NOW + 1)
    out = run_in_another_process(
        "import json, sys\n"
        "from agentops.models import Agent\n"
        "from waits.admission import admission_check\n"
        "from waits.selectors import binding_waits\n"
        "now = float(sys.argv[1])\n"
        "ada = Agent.objects.get(name='ada')\n"
        "holds = {m: (h.until_ms, h.source) if h else None for m in ('m1', 'm2', 'm3') "
        "for h in [admission_check(agent=ada, model=m, now_ms=now)]}\n"
        "readable, waits = binding_waits(now_ms=now)\n"
        "print(json.dumps({'holds': holds, 'readable': readable, "
        "'models': [w['model'] for w in waits]}))\n",
        str(NOW + 2),
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "holds": {"m1": [None, "recorded"], "m2": [NOW + 600_000, "recorded"], "m3": None},
        "readable": True,
        "models": ["m1", "m2"],
    }


@pytest.mark.django_db(transaction=True)
def test_a_release_made_in_another_process_is_honoured_here_within_a_second(agent: Agent) -> None:
    wait_record(agent=agent, model="m1", retry_after_ms=86_400_000, reason="429", now_ms=clock_ms())
    assert held(agent, "m1", clock_ms()) is not None
    out = manage("release_wait", "ada", "--model", "m1", "--reason", "from another process")
    assert out.returncode == 0, out.stderr
    released_at = clock_ms()
    wait_for(
        lambda: held(agent, "m1", clock_ms()) is None,
        timeout=5,
        interval=0.01,
        what="the release to be honoured",
    )
    assert clock_ms() - released_at < 1000


def test_a_wait_recorded_by_another_process_binds_here_at_the_next_check(agent: Agent) -> None:
    assert held(agent, "m1", NOW) is None  # loads this process's view
    insert_row(kind="set", until_ms=int(NOW + 600_000))  # as another worker would append it
    assert held(agent, "m1", NOW + 1) is not None  # not a poll's cadence later: at once


def test_the_listed_waits_read_rows_another_process_appended_at_once(agent: Agent) -> None:
    from waits.selectors import binding_waits

    assert held(agent, "m1", NOW) is None  # loads this process's view
    insert_row(kind="set", until_ms=int(NOW + 600_000))  # as a worker would append it
    _, waits = binding_waits(now_ms=NOW + 1)  # a person reads: the turn says "held" already
    assert [(w["agent"], w["model"]) for w in waits] == [("ada", "m1")]


def test_the_steady_state_admission_check_runs_one_indexed_query_and_reads_no_row(
    agent: Agent,
) -> None:
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    held(agent, "m1", NOW)
    with CaptureQueriesContext(connection) as steady:
        for step in range(100):
            held(agent, "m1", NOW + step)
            held(agent, "m2", NOW + step)
    # Each: the newest id (an index's last entry), nothing new, no row read.
    assert len(steady) == 200 and all(
        q["sql"] == 'SELECT "waits_waitjournalentry"."id" AS "id" FROM "waits_waitjournalentry" '
        "ORDER BY 1 DESC LIMIT 1"
        for q in steady.captured_queries
    ), steady.captured_queries[0]


def test_a_checkpoint_keeps_the_binding_waits_and_a_restart_reads_from_it(agent: Agent) -> None:
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="long", now_ms=NOW)
    wait_record(agent=agent, model="m2", retry_after_ms=1000, reason="short", now_ms=NOW)
    wait_record(agent=agent, model="m3", retry_after_ms=float("nan"), reason="forever", now_ms=NOW)
    checkpoint = journal_checkpoint(by="test", now_ms=NOW + 5000)
    WaitJournalEntry.objects.filter(id__lt=checkpoint).update(kind="garbled")
    restart()
    assert held(agent, "m1", NOW + 5000).until_ms == NOW + 600_000  # type: ignore[union-attr]
    assert held(agent, "m2", NOW + 500) is None  # expired before the checkpoint: not kept
    assert held(agent, "m3", NOW + 5000).until_ms is None  # type: ignore[union-attr]


# --- failing writes -------------------------------------------------------------------------


@pytest.mark.parametrize("sqlstate", ["08006", "40001", "23514"])
def test_a_wait_whose_write_fails_binds_here_and_lands_once_writes_work(
    agent: Agent, refuse_writes: Callable[..., None], sqlstate: str
) -> None:
    held(agent, "m1", NOW)
    refuse_writes(sqlstate)
    result = wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    assert (result.binding, result.until_ms, result.receipt) == (True, NOW + 600_000, "pending")
    assert held(agent, "m1", NOW + 1).source == "pending"  # type: ignore[union-attr]
    assert not WaitJournalEntry.objects.exists()
    # offered again at the recheck cadence, not before; still refused
    held(agent, "m1", NOW + RECHECK)
    assert len(journal_pending()) == 1
    refuse_writes(None)
    held(agent, "m1", NOW + RECHECK + 1)
    assert len(journal_pending()) == 1  # the next offer is a recheck away
    hold = held(agent, "m1", NOW + 2 * RECHECK)
    assert hold is not None and hold.source == "recorded"
    assert journal_pending() == []
    assert WaitJournalEntry.objects.filter(kind="set").count() == 1
    restart()
    hold = held(agent, "m1", NOW + 2 * RECHECK)
    assert hold is not None and hold.until_ms == NOW + 600_000


def test_pending_acts_are_offered_again_in_order_at_the_next_act(
    agent: Agent, refuse_writes: Callable[..., None]
) -> None:
    held(agent, "m1", NOW)
    refuse_writes()
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    receipts = wait_release(
        agent="ada", model="m1", reason="ok", via="api", requester="ops", now_ms=NOW + 1
    )
    assert [r.release for r in receipts] == ["pending"]
    assert held(agent, "m1", NOW + 2) is None  # the pending release binds here too
    refuse_writes(None)
    result = wait_record(agent=agent, model="m2", retry_after_ms=1000, reason="429", now_ms=NOW + 3)
    assert result.receipt == "recorded"
    assert list(WaitJournalEntry.objects.order_by("id").values_list("kind", "model")) == [
        ("set", "m1"),
        ("release", "m1"),
        ("set", "m2"),
    ]
    assert AuditEntry.objects.filter(action="wait.release").count() == 1
    restart()
    assert held(agent, "m1", NOW + 4) is None


def test_an_act_behind_a_pending_one_waits_its_turn(
    agent: Agent, refuse_writes: Callable[..., None]
) -> None:
    held(agent, "m1", NOW)
    refuse_writes(when="NEW.model = 'm1'")
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    # m2 could be written, but not before m1: it stays pending behind it
    second = wait_record(
        agent=agent, model="m2", retry_after_ms=600_000, reason="429", now_ms=NOW + 1
    )
    assert second.receipt == "pending"
    assert not WaitJournalEntry.objects.exists()
    refuse_writes(None)
    third = wait_record(
        agent=agent, model="m3", retry_after_ms=600_000, reason="429", now_ms=NOW + 2
    )
    assert third.receipt == "recorded"
    assert list(WaitJournalEntry.objects.order_by("id").values_list("model", flat=True)) == [
        "m1",
        "m2",
        "m3",
    ]


def test_an_act_made_inside_a_callers_transaction_stays_pending_until_it_can_commit_on_its_own(
    agent: Agent,
) -> None:
    held(agent, "m1", NOW)
    with transaction.atomic():
        result = wait_record(
            agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW
        )
    assert result.receipt == "pending"
    assert held(agent, "m1", NOW + 1).source == "pending"  # type: ignore[union-attr]
    assert not WaitJournalEntry.objects.exists()
    assert held(agent, "m1", NOW + RECHECK).source == "recorded"  # type: ignore[union-attr]
    assert WaitJournalEntry.objects.count() == 1


def test_an_ambiguous_commit_replayed_does_not_apply_twice(
    agent: Agent, refuse_writes: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    held(agent, "m1", NOW)
    refuse_writes()
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    wait_release(agent="ada", model="m1", reason="ok", via="api", requester="ops", now_ms=NOW + 1)
    first, second = journal_pending()
    refuse_writes(None)
    # The caller saw errors, but both commits had in fact landed, the release with its audit entry.
    insert_row(kind="set", until_ms=int(NOW + 600_000), reason="429", act_id=str(first.act_id))
    insert_row(kind="release", model="m1", act_id=str(second.act_id))
    AuditEntry.objects.create(
        actor="api:ops", action="wait.release", target="ada/m1", reason="ok", data={}
    )
    caplog.clear()
    held(agent, "m1", NOW + 1 + RECHECK)  # the replay, offered before new rows are read
    assert "could not record" not in caplog.text  # the second insert is a no-op, not an error
    assert journal_pending() == []
    assert WaitJournalEntry.objects.count() == 2
    assert AuditEntry.objects.filter(action="wait.release").count() == 1
    restart()
    assert held(agent, "m1", NOW + RECHECK) is None


@pytest.mark.django_db(transaction=True)
def test_a_wait_recorded_while_the_database_is_unreachable_binds_here_and_lands_once_it_is_back(
    agent: Agent,
) -> None:
    assert held(agent, "m1", NOW) is None
    with unreachable_database():
        result = wait_record(
            agent=agent, model="m1", retry_after_ms=86_400_000, reason="429", now_ms=NOW
        )
        assert (result.binding, result.receipt) == (True, "pending")
        hold = held(agent, "m1", NOW + JOURNAL_POLL_MS)  # the poll fails: the cached view stands
        assert hold is not None and hold.source == "pending"
        assert held(agent, "m2", NOW + JOURNAL_POLL_MS) is None
    hold = held(agent, "m1", NOW + RECHECK)
    assert hold is not None and hold.source == "recorded"
    assert WaitJournalEntry.objects.count() == 1
    # its alert was written with it, once
    assert Alert.objects.filter(kind="provider-wait", agent="ada", model="m1").count() == 1


@contextmanager
def unreachable_database() -> Iterator[None]:
    """Point this process's connection (and its pool) at a port nothing listens on."""
    saved = copy.deepcopy(connection.settings_dict)
    close_pool = getattr(connection, "close_pool", lambda: None)  # the PostgreSQL backend's
    connection.close()
    close_pool()
    connection.settings_dict["PORT"] = "1"
    if connection.settings_dict["OPTIONS"].get("pool"):
        connection.settings_dict["OPTIONS"]["pool"] = {
            **connection.settings_dict["OPTIONS"]["pool"],
            "timeout": 0.5,
        }
    try:
        yield
    finally:
        connection.close()
        close_pool()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)


# --- unreadable records ----------------------------------------------------------------------

GOOD_WAIT = {
    "agent": "ada",
    "model": "m1",
    "until": int(NOW + 600_000),
    "reason": "r",
    "set_at": NOW,
}
MALFORMED_ROWS: dict[str, dict[str, Any]] = {
    "unknown kind": {"kind": "pause"},
    "missing agent": {"kind": "set", "agent": "", "until_ms": int(NOW + 1000)},
    "missing model": {"kind": "release", "model": ""},
    "deadline below zero": {"kind": "set", "until_ms": -5},
    "deadline past the largest instant": {"kind": "set", "until_ms": MAX_INSTANT_MS + 1},
    "control character in the model": {"kind": "set", "model": "m\n1", "until_ms": int(NOW + 1000)},
    "checkpoint without a snapshot": {"kind": "checkpoint", "agent": "", "model": "", "data": {}},
    "checkpoint with one (agent, model) twice": {
        "kind": "checkpoint",
        "agent": "",
        "model": "",
        "data": {"waits": [GOOD_WAIT, GOOD_WAIT]},
    },
    "checkpoint wait without a deadline": {
        "kind": "checkpoint",
        "agent": "",
        "model": "",
        "data": {"waits": [{**GOOD_WAIT, "until": "later"}]},
    },
}
REPAIRS: dict[str, str] = {
    "unknown kind": "kind = 'release', model = '*'",
    "missing agent": "agent = 'bob'",
    "missing model": "model = '*'",
    "deadline below zero": "until_ms = 1",
    "deadline past the largest instant": "until_ms = 1",
    "control character in the model": "model = 'm1'",
    "checkpoint without a snapshot": "data = '{\"waits\": []}'::jsonb",
    "checkpoint with one (agent, model) twice": "data = '{\"waits\": []}'::jsonb",
    "checkpoint wait without a deadline": "data = '{\"waits\": []}'::jsonb",
}


@pytest.mark.parametrize("shape", MALFORMED_ROWS)
def test_a_malformed_row_fails_closed_after_a_restart_and_opens_at_the_next_reread_once_repaired(
    agent: Agent, shape: str
) -> None:
    bob: Agent = AgentFactory.create(name="bob")
    bad = insert_row(**MALFORMED_ROWS[shape])
    restart()
    for who, model in [(agent, "m1"), (agent, "other"), (bob, "m7")]:
        hold = held(who, model, NOW)
        assert hold is not None and (hold.model, hold.source, hold.until_ms) == (
            "*",
            "unreadable",
            None,
        )
        assert str(bad) in hold.reason
    assert framework_alerts() == 1
    held(agent, "m1", NOW + 1)
    restart()  # a worker restarting into the same episode does not raise it again
    held(agent, "m1", NOW + 2)
    assert framework_alerts() == 1

    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {WaitJournalEntry._meta.db_table} SET {REPAIRS[shape]} WHERE id = %s", [bad]
        )
    assert held(agent, "m1", NOW + RECHECK - 1) is not None  # until the next re-read
    assert held(agent, "m1", NOW + 2 + RECHECK) is None
    assert held(bob, "m7", NOW + 2 + RECHECK) is None
    assert framework_alerts() == 1


def test_inspection_works_while_the_records_are_unreadable(agent: Agent) -> None:
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    bad = insert_row(kind="pause")
    restart()
    from waits.selectors import binding_waits, journal_entries

    readable, waits = binding_waits(now_ms=NOW + 1)
    assert not readable
    assert [(w["agent"], w["model"], w["source"], w["until"] is None) for w in waits] == [
        ("ada", "*", "unreadable", True),
        ("ada", "m1", "recorded", False),
    ]
    entries = journal_entries(agent=None, limit=10)
    assert entries[0]["id"] == bad and "unknown kind" in entries[0]["problem"]
    assert entries[1]["problem"] is None


def test_the_framework_alert_is_raised_once_per_episode(agent: Agent) -> None:
    first = insert_row(kind="pause")
    held(agent, "m1", NOW)
    held(agent, "m1", NOW + RECHECK)  # re-read: still unreadable, same episode
    assert framework_alerts() == 1
    WaitJournalEntry.objects.filter(id=first).update(kind="release", model="*")
    assert held(agent, "m1", NOW + 2 * RECHECK) is None  # episode over
    second = insert_row(kind="pause again")
    assert held(agent, "m1", NOW + 2 * RECHECK + JOURNAL_POLL_MS) is not None  # found by the poll
    assert framework_alerts() == 2
    alert = Alert.objects.filter(agent="framework").order_by("-id").first()
    assert alert is not None and str(second) in alert.message and "release_wait" in alert.message


def test_an_operator_release_during_the_episode_lifts_exactly_what_it_names_for_every_worker(
    agent: Agent,
) -> None:
    bob: Agent = AgentFactory.create(name="bob")
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    bad = insert_row(kind="pause")
    restart()
    assert held(agent, "m2", NOW) is not None
    receipts = wait_release(
        agent="ada", model="m2", reason="unblock", via="api", requester="ops", now_ms=NOW + 1
    )
    assert [(r.model, r.until_ms, r.release) for r in receipts] == [("m2", None, "recorded")]
    assert held(agent, "m2", NOW + 2) is None
    assert held(agent, "m1", NOW + 2) is not None and held(bob, "m1", NOW + 2) is not None
    receipts = wait_release(
        agent="bob", reason="unblock", via="api", requester="ops", now_ms=NOW + 3
    )
    assert [(r.model, r.until_ms) for r in receipts] == [("*", None)]
    restart()  # another worker, reading the journal
    assert held(agent, "m2", NOW + 4) is None and held(bob, "m9", NOW + 4) is None
    assert held(agent, "m1", NOW + 4).source == "unreadable"  # type: ignore[union-attr]
    # once the row reads, the releases apply in order: ada's recorded m1 wait still binds
    WaitJournalEntry.objects.filter(id=bad).update(kind="set", model="m3", until_ms=None)
    hold = held(agent, "m1", NOW + 4 + RECHECK)
    assert hold is not None and hold.source == "recorded" and hold.until_ms == NOW + 600_000
    assert held(agent, "m3", NOW + 4 + RECHECK).until_ms is None  # type: ignore[union-attr]
    assert held(agent, "m2", NOW + 4 + RECHECK) is None


def test_a_held_check_takes_a_recovered_waits_deadline(agent: Agent) -> None:
    bad = insert_row(kind="set", until_ms=-1)
    assert held(agent, "m1", NOW).source == "unreadable"  # type: ignore[union-attr]
    WaitJournalEntry.objects.filter(id=bad).update(until_ms=int(NOW + 600_000))
    hold = held(agent, "m1", NOW + RECHECK)
    assert hold is not None and hold.source == "recorded" and hold.until_ms == NOW + 600_000


def test_a_checkpoint_is_refused_while_the_records_are_unreadable(agent: Agent) -> None:
    from agentops.exceptions import Conflict

    insert_row(kind="pause")
    with pytest.raises(Conflict):
        journal_checkpoint(by="test", now_ms=NOW)
    assert not WaitJournalEntry.objects.filter(kind="checkpoint").exists()
