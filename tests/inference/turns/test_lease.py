"""The turn lease when the database does not answer: the call goes on while the lease holds,
and the run stops once it may have expired (another worker may then take the agent).

Runs in a separate process on ``agentops.settings`` (with the connection pool, as a worker
does), pointed at a port where nothing listens."""

from __future__ import annotations

from tests.conftest import _database_url
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
print(json.dumps({"while_valid": while_valid, "lost_while_valid": lost_while_valid, "after_expiry": after_expiry, "lost": lease.lost}))
"""


def test_a_renewal_the_database_does_not_answer_keeps_the_call_going_until_the_lease_could_have_expired() -> None:
    unreachable = _database_url().rsplit("@", 1)[0] + "@127.0.0.1:1/nowhere"
    seen = run_worker_process(
        RENEW_WITH_THE_DATABASE_DOWN,
        env={"DATABASE_URL": unreachable, "AGENTOPS_DB_POOL_TIMEOUT_MS": "500", "AGENTOPS_TURN_LEASE_MS": "1000"},
    )
    assert seen == {"while_valid": True, "lost_while_valid": False, "after_expiry": False, "lost": True}
