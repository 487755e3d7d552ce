"""The per-agent turn lease: one worker at a time runs an agent's turns.

A claim is one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` statement, so two workers racing
for the same agent cannot both win, and no connection or transaction is held while the turn
runs (a call can last 75 minutes; a held connection per call would exhaust the database).

Every lease a process holds is renewed by the runtime's one renewer (``LeaseRenewer``, a task
on its loop), in one statement each quarter lease, whatever the number of leases, and ahead of
the turns' bookkeeping (its statement has a thread of its own). A turn asks its lease nothing
while its call is out: the renewer wakes it if the lease is lost (``wake_on_loss``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from agentops import telemetry
from agentops.models import Agent
from agentops.runtime import Runtime, Settable
from inference.models import AgentLease

logger = logging.getLogger(__name__)

# An agent that no longer exists (a drain task older than its agent) gets no lease: the insert
# finds no row to write, and the run ends with nothing to do, rather than on a foreign key error.
_CLAIM_SQL = f"""
INSERT INTO {AgentLease._meta.db_table} (agent_id, owner, until)
SELECT %s, %s, %s WHERE EXISTS (SELECT 1 FROM {Agent._meta.db_table} WHERE id = %s)
ON CONFLICT (agent_id) DO UPDATE SET owner = EXCLUDED.owner, until = EXCLUDED.until
WHERE ({AgentLease._meta.db_table}.until < %s AND pg_postmaster_start_time() < %s)
   OR {AgentLease._meta.db_table}.owner = EXCLUDED.owner
RETURNING owner
"""


_RENEW_SQL = f"""
UPDATE {AgentLease._meta.db_table} AS lease SET until = %s
FROM unnest(%s::bigint[], %s::text[]) AS mine(agent_id, owner)
WHERE lease.agent_id = mine.agent_id AND lease.owner = mine.owner
RETURNING lease.agent_id, lease.owner
"""
_RELEASE_SQL = f"DELETE FROM {AgentLease._meta.db_table} WHERE agent_id = %s AND owner = %s"

# While the database does not answer, the renewer tries again this often (the lease is renewed
# well within the claim's grace once it is back).
RENEW_RETRY_S = 0.2


class TurnLease:
    """A claimed lease, kept by the process's renewer; ``lost`` turns true if another worker
    took it over (only possible after this one failed to renew in time). ``renew_if_due()``
    renews it from the asking thread when the renewer has not done so for a quarter lease, or
    while the last renewal failed (bookkeeping waiting for the database asks at each try)."""

    def __init__(self, agent_id: int, owner: str, renewer: LeaseRenewer) -> None:
        self.agent_id = agent_id
        self.owner = owner
        self._renewer = renewer
        self.lost = False
        self.failing = False  # the last renewal got no answer from the database
        self._renewed = time.monotonic()
        self._wakes: set[Settable] = set()
        self._wakes_lock = threading.Lock()

    def wake_on_loss(self, event: Settable) -> Callable[[], None]:
        """Set ``event`` when the lease is lost (at once if it is); returns the undo."""
        with self._wakes_lock:
            self._wakes.add(event)
            lost = self.lost
        if lost:
            event.set()

        def forget() -> None:
            with self._wakes_lock:
                self._wakes.discard(event)

        return forget

    def _lose(self) -> None:
        with self._wakes_lock:
            was_lost, self.lost = self.lost, True
            wakes = list(self._wakes)
        if not was_lost:
            logger.error(
                "agent %s: the turn lease of %s was taken over; stopping this run",
                self.agent_id,
                self.owner,
            )
        for event in wakes:
            event.set()

    def _renewal_failed(self, exc: Exception) -> None:
        expired = time.monotonic() - self._renewed >= settings.AGENTOPS_TURN_LEASE_MS / 1000
        if not self.failing:
            logger.warning(
                "agent %s: could not renew the turn lease (%s)%s",
                self.agent_id,
                type(exc).__name__,
                "; it has expired" if expired else "",
            )
        self.failing = True

    def _renewal_done(self, at: float) -> None:
        if self.failing:
            logger.warning(
                "agent %s: the turn lease is renewed again after the database came back",
                self.agent_id,
            )
        self.failing = False
        self._renewed = max(self._renewed, at)

    @property
    def duration(self) -> timedelta:
        return timedelta(milliseconds=settings.AGENTOPS_TURN_LEASE_MS)

    def renew_if_due(self) -> bool:
        """Renew when a quarter of the lease has passed, or at once while the last renewal
        failed (the database did not answer). Returns False once the lease is lost.

        A renewal that fails because the database is down does not lose the lease, even past
        its deadline: nobody can claim it while the database is down, and the renewal (by
        owner, whatever its deadline) is tried again at the next ask, so the lease is renewed
        as soon as the database is back, before a sweep can hand the agent to another worker.
        It is lost only when the renewal finds another owner."""
        if self.lost:
            return False
        if (
            not self.failing
            and time.monotonic() - self._renewed < settings.AGENTOPS_TURN_LEASE_MS / 4000
        ):
            return True
        started = time.monotonic()
        try:
            now = timezone.now()
            updated = AgentLease.objects.filter(agent_id=self.agent_id, owner=self.owner).update(
                until=now + self.duration
            )
        except DatabaseError as exc:
            # The database did not answer (down, or no connection free within the pool's
            # timeout): the call goes on and the renewal is tried again at the next ask.
            connection.close()
            self._renewal_failed(exc)
            return True
        if not updated:
            self._lose()
            return False
        self._renewal_done(started)
        return True

    def release(self) -> None:
        self._renewer.forget(self)
        try:
            with connection.cursor() as cursor:
                cursor.execute(_RELEASE_SQL, [self.agent_id, self.owner])
        except DatabaseError:
            # Down: the lease lapses at its deadline and the sweep hands the agent on.
            connection.close()
            logger.warning(
                "agent %s: could not release the turn lease; it lapses at its deadline",
                self.agent_id,
            )


def lease_claim(renewer: LeaseRenewer, agent_id: int) -> TurnLease | None:
    """Claim the agent's turn lease for this run, or None if a live one is held; the process's
    ``renewer`` keeps it."""
    # Who holds it, as an operator reads it in a takeover's log line: the Celery worker's name
    # (or the host), the process, and this run.
    me = telemetry.process_identity()
    owner = f"{(me['worker'] or me['host'])[:150]}:{me['pid']}:{uuid.uuid4().hex[:12]}"
    now = timezone.now()
    until = now + timedelta(milliseconds=settings.AGENTOPS_TURN_LEASE_MS)
    # A lapsed lease is taken over only after a grace, and not within a grace of the database
    # starting: its owner, if alive, renews it first once the database answers again.
    grace_ago = now - timedelta(milliseconds=settings.AGENTOPS_TURN_LEASE_GRACE_MS)
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, [agent_id, owner, until, agent_id, grace_ago, grace_ago])
        row = cursor.fetchone()
    if not row:
        return None
    lease = TurnLease(agent_id, owner, renewer)
    renewer.keep(lease)
    return lease


class LeaseRenewer:
    """Renews every lease this process holds, in one statement each quarter lease (or every
    ``RENEW_RETRY_S`` while the database does not answer): a task on the runtime's loop, its
    statement on a thread of its own (never queued behind the turns' database threads).

    A renewal that fails because the database is down loses no lease, even past its deadline
    (nobody can claim it while the database is down); the next try renews it by owner as soon
    as the database answers. A lease whose row the statement does not find (another owner took
    it, after this process failed to renew it in time) is lost, and its waiting call woken."""

    def __init__(self, runtime: Runtime) -> None:
        self._leases: set[TurnLease] = set()
        self._lock = threading.Lock()  # keep and forget come from the database threads
        self._failing = False
        self.rounds = 0  # rounds tried, each one statement (for the process's metrics and tests)
        self._statements = ThreadPoolExecutor(1, thread_name_prefix="agentops-lease")
        self._loop = runtime.loop
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        runtime.loop.call_soon_threadsafe(self._start)

    def _start(self) -> None:
        self._task = self._loop.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._statements.shutdown(wait=False)

    def keep(self, lease: TurnLease) -> None:
        with self._lock:
            self._leases.add(lease)

    def forget(self, lease: TurnLease) -> None:
        with self._lock:
            self._leases.discard(lease)

    def renew_now(self) -> None:
        """Wake the renewer for a round now (the next one follows a quarter lease after it)."""
        self._loop.call_soon_threadsafe(self._kick.set)

    async def _run(self) -> None:
        while True:
            interval = RENEW_RETRY_S if self._failing else settings.AGENTOPS_TURN_LEASE_MS / 4000
            try:
                await asyncio.wait_for(self._kick.wait(), interval)
            except TimeoutError:
                pass
            self._kick.clear()
            try:
                await self._loop.run_in_executor(self._statements, self.renew_all)
            except Exception:  # the task must outlive anything one round meets
                logger.exception("the turn lease renewer failed a round; it goes on")
                self._failing = True

    def renew_all(self) -> None:
        """One round: every lease held and not lost, in one statement."""
        with self._lock:
            leases = [lease for lease in self._leases if not lease.lost]
        if not leases:
            self._failing = False
            return
        self.rounds += 1
        started = time.monotonic()
        until = timezone.now() + timedelta(milliseconds=settings.AGENTOPS_TURN_LEASE_MS)
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    _RENEW_SQL,
                    [
                        until,
                        [lease.agent_id for lease in leases],
                        [lease.owner for lease in leases],
                    ],
                )
                kept = {(int(agent_id), str(owner)) for agent_id, owner in cursor.fetchall()}
        except DatabaseError as exc:
            self._failing = True
            for lease in leases:
                lease._renewal_failed(exc)
            return
        finally:
            connection.close()  # back to the pool until the next round
        self._failing = False
        for lease in leases:
            if (lease.agent_id, lease.owner) in kept:
                lease._renewal_done(started)
                continue
            with self._lock:
                held = lease in self._leases  # not released while the statement ran
            if held:
                lease._lose()
