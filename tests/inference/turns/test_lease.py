"""The turn lease when the database does not answer: the call goes on, even past the lease's
deadline (nobody can claim the agent while the database is down), and the renewal is tried
again at every ask, so the lease is renewed as soon as the database is back; the run stops
only when the renewal finds another owner.

The first test runs in a separate process on ``agentops.settings`` (with the connection pool,
as a worker does), pointed at a port where nothing listens."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from inference.models import AgentLease
from inference.turns.lease import lease_claim
from tests.conftest import _database_url
from tests.factories import AgentFactory
from tests.waits.test_journal_stalls import run_worker_process

RENEW_WITH_THE_DATABASE_DOWN = """
import json, time
from inference.turns.lease import TurnLease

lease = TurnLease(agent_id=1, owner="w1")
quarter, whole = 1000 / 4000, 1000 / 1000  # AGENTOPS_TURN_LEASE_MS=1000
lease._renewed = time.monotonic() - quarter  # a renewal is due, the lease still holds
while_valid = lease.renew_if_due()
lost_while_valid = lease.lost
lease._renewed = time.monotonic() - whole  # not renewed for a whole lease
after_expiry = lease.renew_if_due()
print(json.dumps({"while_valid": while_valid, "lost_while_valid": lost_while_valid, "after_expiry": after_expiry, "lost": lease.lost, "failing": lease.failing}))
"""


def test_a_renewal_the_database_does_not_answer_keeps_the_call_going_even_past_the_lease_deadline() -> None:
    unreachable = _database_url().rsplit("@", 1)[0] + "@127.0.0.1:1/nowhere"
    seen = run_worker_process(
        RENEW_WITH_THE_DATABASE_DOWN,
        env={"DATABASE_URL": unreachable, "AGENTOPS_DB_POOL_TIMEOUT_MS": "500", "AGENTOPS_TURN_LEASE_MS": "1000"},
    )
    assert seen == {"while_valid": True, "lost_while_valid": False, "after_expiry": True, "lost": False, "failing": True}


@pytest.mark.django_db(transaction=True)  # the renewal gives its connection back
def test_once_the_database_answers_a_lease_that_could_not_be_renewed_is_renewed_at_once_unless_taken() -> None:
    agent = AgentFactory.create()
    lease = lease_claim(agent.pk)
    assert lease is not None
    past = timezone.now() - timedelta(seconds=5)
    AgentLease.objects.filter(agent=agent).update(until=past)  # it lapsed while the database was down
    lease.failing = True  # the last renewal got no answer: the next ask renews, whatever the cadence
    assert lease.renew_if_due() and not lease.lost and not lease.failing
    assert AgentLease.objects.get(agent=agent).until > timezone.now()
    AgentLease.objects.filter(agent=agent).update(owner="another-worker", until=past)  # taken over meanwhile
    lease.failing = True
    assert not lease.renew_if_due() and lease.lost
    assert AgentLease.objects.get(agent=agent).owner == "another-worker"


@pytest.mark.django_db(transaction=True)
def test_a_lapsed_lease_is_taken_over_only_after_the_grace_in_which_its_owner_would_renew_it() -> None:
    agent = AgentFactory.create()
    assert lease_claim(agent.pk) is not None
    grace = timedelta(milliseconds=settings.AGENTOPS_TURN_LEASE_GRACE_MS)
    assert grace > timedelta(0)
    AgentLease.objects.filter(agent=agent).update(until=timezone.now() - grace / 2)  # lapsed, within the grace
    assert lease_claim(agent.pk) is None
    AgentLease.objects.filter(agent=agent).update(until=timezone.now() - grace - timedelta(seconds=1))
    taken = lease_claim(agent.pk)
    assert taken is not None and AgentLease.objects.get(agent=agent).owner == taken.owner
