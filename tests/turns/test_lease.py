"""The turn lease when the database does not answer: the call goes on, even past the lease's
deadline (nobody can claim the agent while the database is down), and the renewal is tried
again at every ask, so the lease is renewed as soon as the database is back; the run stops
only when the renewal finds another owner.

The first test runs in a separate process on ``agentops.settings`` (with the connection pool,
as a worker does), pointed at a port where nothing listens."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings
from django.utils import timezone

from inference.models import AgentLease
from tests.conftest import _database_url, wait_for
from tests.factories import AgentFactory
from tests.waits.test_journal_stalls import run_worker_process
from turns.lease import lease_claim
from turns.runtime import TurnRuntime

RENEW_WITH_THE_DATABASE_DOWN = """
import json, time
from turns.lease import TurnLease

lease = TurnLease(1, "w1", runtime.leases)
quarter, whole = 1000 / 4000, 1000 / 1000  # AGENTOPS_TURN_LEASE_MS=1000
lease._renewed = time.monotonic() - quarter  # a renewal is due, the lease still holds
while_valid = lease.renew_if_due()
lost_while_valid = lease.lost
lease._renewed = time.monotonic() - whole  # not renewed for a whole lease
after_expiry = lease.renew_if_due()
print(json.dumps({
    "while_valid": while_valid,
    "lost_while_valid": lost_while_valid,
    "after_expiry": after_expiry,
    "lost": lease.lost,
    "failing": lease.failing,
}))
"""


def test_a_renewal_the_database_does_not_answer_keeps_the_call_going_even_past_the_lease_deadline() -> (
    None
):
    unreachable = _database_url().rsplit("@", 1)[0] + "@127.0.0.1:1/nowhere"
    seen = run_worker_process(
        RENEW_WITH_THE_DATABASE_DOWN,
        env={
            "DATABASE_URL": unreachable,
            "AGENTOPS_DB_POOL_TIMEOUT_MS": "500",
            "AGENTOPS_TURN_LEASE_MS": "1000",
        },
    )
    assert seen == {
        "while_valid": True,
        "lost_while_valid": False,
        "after_expiry": True,
        "lost": False,
        "failing": True,
    }


@pytest.mark.django_db(transaction=True)  # the renewal gives its connection back
def test_once_the_database_answers_a_lease_that_could_not_be_renewed_is_renewed_at_once_unless_taken(
    runtime: TurnRuntime,
) -> None:
    agent = AgentFactory.create()
    lease = lease_claim(runtime.leases, agent.pk)
    assert lease is not None
    past = timezone.now() - timedelta(seconds=5)
    AgentLease.objects.filter(agent=agent).update(
        until=past
    )  # it lapsed while the database was down
    lease.failing = (
        True  # the last renewal got no answer: the next ask renews, whatever the cadence
    )
    assert lease.renew_if_due() and not lease.lost and not lease.failing
    assert AgentLease.objects.get(agent=agent).until > timezone.now()
    AgentLease.objects.filter(agent=agent).update(
        owner="another-worker", until=past
    )  # taken over meanwhile
    lease.failing = True
    assert not lease.renew_if_due() and lease.lost
    assert AgentLease.objects.get(agent=agent).owner == "another-worker"
    # No live lease left for the settling between tests to wait on.
    AgentLease.objects.all().delete()


@pytest.mark.django_db(transaction=True)
def test_a_lapsed_lease_is_taken_over_only_after_the_grace_in_which_its_owner_would_renew_it(
    runtime: TurnRuntime,
) -> None:
    agent = AgentFactory.create()
    assert lease_claim(runtime.leases, agent.pk) is not None
    grace = timedelta(milliseconds=settings.AGENTOPS_TURN_LEASE_GRACE_MS)
    assert grace > timedelta(0)
    AgentLease.objects.filter(agent=agent).update(
        until=timezone.now() - grace / 2
    )  # lapsed, within the grace
    assert lease_claim(runtime.leases, agent.pk) is None
    AgentLease.objects.filter(agent=agent).update(
        until=timezone.now() - grace - timedelta(seconds=1)
    )
    taken = lease_claim(runtime.leases, agent.pk)
    assert taken is not None and AgentLease.objects.get(agent=agent).owner == taken.owner
    taken.release()


# --- the process's one renewer ----------------------------------------------------------------


def _renewed_by_one_round(agent_ids: list[int], since: Any) -> bool:
    rows = AgentLease.objects.filter(agent_id__in=agent_ids)
    return rows.count() == len(agent_ids) and not rows.filter(until__lte=since).exists()


@pytest.mark.django_db(transaction=True)
def test_one_statement_renews_every_lease_the_process_holds_each_quarter_lease(
    runtime: TurnRuntime,
) -> None:
    agents = AgentFactory.create_batch(200)
    ids = [agent.pk for agent in agents]
    threads_before = threading.active_count()
    with override_settings(AGENTOPS_TURN_LEASE_MS=800):  # a round every 200 ms
        renewer = runtime.leases
        leases = [lease_claim(runtime.leases, agent_id) for agent_id in ids]
        assert all(lease is not None for lease in leases)
        # Each claim was a statement of its own: 200 transactions wrote the rows.
        assert _xmins(ids) == 200
        claimed_until = max(
            AgentLease.objects.filter(agent_id__in=ids).values_list("until", flat=True)
        )
        statements_before = renewer.rounds
        renewer.renew_now()
        started = time.monotonic()
        wait_for(
            lambda: _renewed_by_one_round(ids, claimed_until), timeout=5, what="a renewal round"
        )
        # Every row renewed by one transaction, and so after each round that follows.
        assert _xmins(ids) == 1
        # Five more rounds (200 ms each): a round writing in more than one transaction would show.
        wait_for(
            lambda: renewer.rounds - statements_before >= 6, timeout=5, what="five more rounds"
        )
        assert _xmins(ids) == 1
        rounds = renewer.rounds - statements_before
        elapsed = time.monotonic() - started
        # One statement a round, whatever the number of leases: about elapsed / 200 ms.
        assert 3 <= rounds <= elapsed / 0.2 + 2, (rounds, elapsed)
        assert not any(lease.lost or lease.failing for lease in leases if lease is not None)
        for lease in leases:
            assert lease is not None
            lease.release()
    assert threading.active_count() <= threads_before + 1  # the renewer, not a thread per lease
    assert not AgentLease.objects.filter(agent_id__in=ids).exists()


def _xmins(agent_ids: list[int]) -> int:
    """How many transactions last wrote these lease rows (PostgreSQL's own record)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(DISTINCT xmin::text) FROM {AgentLease._meta.db_table} "
            "WHERE agent_id = ANY(%s)",
            [agent_ids],
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.django_db(transaction=True)
def test_a_lease_taken_over_is_lost_at_the_next_round_and_wakes_what_waits_on_it(
    runtime: TurnRuntime,
) -> None:
    mine, other = AgentFactory.create(), AgentFactory.create()
    with override_settings(AGENTOPS_TURN_LEASE_MS=800):
        taken, kept = lease_claim(runtime.leases, mine.pk), lease_claim(runtime.leases, other.pk)
        assert taken is not None and kept is not None
        woken = threading.Event()
        forget = taken.wake_on_loss(woken)
        AgentLease.objects.filter(agent=mine).update(owner="another-worker")
        runtime.leases.renew_now()
        assert woken.wait(5), "the waiting call was not woken"
        forget()
        assert taken.lost and not kept.lost
        assert AgentLease.objects.get(agent=mine).owner == "another-worker"  # not touched
        late = threading.Event()
        taken.wake_on_loss(late)
        assert late.is_set()  # asked after the loss: woken at once
        kept.release()
        taken.release()
    assert (
        AgentLease.objects.get(agent=mine).owner == "another-worker"
    )  # a lost lease's release deletes nothing of the new owner's
    AgentLease.objects.all().delete()


RENEWER_WITH_THE_DATABASE_DOWN = """
import json, time
from turns.lease import TurnLease

renewer = runtime.leases
lease = TurnLease(1, "w1", renewer)
renewer.keep(lease)
renewer.renew_now()
# A span of time is what is measured: in 2 s unanswered, several tries if it tries again
# within a fraction of a second (a quarter lease here is 15 s).
time.sleep(2.0)
print(json.dumps({"tries": renewer.rounds, "lost": lease.lost, "failing": lease.failing}))
"""


def test_while_the_database_does_not_answer_the_renewer_keeps_its_leases_and_tries_again_within_a_fraction_of_a_second() -> (
    None
):
    unreachable = _database_url().rsplit("@", 1)[0] + "@127.0.0.1:1/nowhere"
    seen = run_worker_process(
        RENEWER_WITH_THE_DATABASE_DOWN,
        # A quarter lease is 15 s: tries every fraction of a second are the retries, not rounds.
        env={
            "DATABASE_URL": unreachable,
            "AGENTOPS_DB_POOL_TIMEOUT_MS": "200",
            "AGENTOPS_TURN_LEASE_MS": "60000",
        },
    )
    assert seen["lost"] is False and seen["failing"] is True
    assert seen["tries"] >= 3, seen


@pytest.mark.django_db(transaction=True)
def test_an_agent_that_no_longer_exists_gets_no_lease_and_no_error(runtime: TurnRuntime) -> None:
    """A drain task older than its agent (a queue left over from another database): its run
    finds nothing to claim, rather than failing on the lease's foreign key."""
    gone = AgentFactory.create()
    gone_id = gone.pk
    gone.delete()
    assert lease_claim(runtime.leases, gone_id) is None
    assert not AgentLease.objects.filter(agent_id=gone_id).exists()
    here = AgentFactory.create()
    lease = lease_claim(runtime.leases, here.pk)
    assert lease is not None
    lease.release()
