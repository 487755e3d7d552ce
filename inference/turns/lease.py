"""The per-agent turn lease: one worker at a time runs an agent's turns.

A claim is one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE`` statement, so two workers racing
for the same agent cannot both win, and no connection or transaction is held while the turn
runs (a call can last 75 minutes; a held connection per call would exhaust the database).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from inference.models import AgentLease

logger = logging.getLogger(__name__)

_CLAIM_SQL = f"""
INSERT INTO {AgentLease._meta.db_table} (agent_id, owner, until)
VALUES (%s, %s, %s)
ON CONFLICT (agent_id) DO UPDATE SET owner = EXCLUDED.owner, until = EXCLUDED.until
WHERE ({AgentLease._meta.db_table}.until < %s AND pg_postmaster_start_time() < %s)
   OR {AgentLease._meta.db_table}.owner = EXCLUDED.owner
RETURNING owner
"""


class TurnLease:
    """A claimed lease. ``renew_if_due()`` keeps it; ``lost`` turns true if another worker took
    it over (only possible after this one failed to renew in time)."""

    def __init__(self, agent_id: int, owner: str, *, gate: AbstractContextManager[Any] | None = None) -> None:
        self.agent_id = agent_id
        self.owner = owner
        self.lost = False
        self.failing = False  # the last renewal got no answer from the database
        self._renewed = time.monotonic()
        # Held around the renewal's query. The drain passes its bookkeeping gate: a thousand
        # waiting turns renewing at once would otherwise starve the loop that times the cuts.
        self.gate = gate if gate is not None else nullcontext()

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
        if not self.failing and time.monotonic() - self._renewed < settings.AGENTOPS_TURN_LEASE_MS / 4000:
            return True
        try:
            with self.gate:
                now = timezone.now()
                updated = AgentLease.objects.filter(agent_id=self.agent_id, owner=self.owner).update(until=now + self.duration)
                connection.close()  # give the connection back to the pool while the call runs
        except DatabaseError as exc:
            # The database did not answer (down, or no connection free within the pool's
            # timeout): the call goes on and the renewal is tried again at the next ask.
            connection.close()
            expired = time.monotonic() - self._renewed >= settings.AGENTOPS_TURN_LEASE_MS / 1000
            if not self.failing:
                logger.warning("agent %s: could not renew the turn lease (%s)%s", self.agent_id, type(exc).__name__, "; it has expired" if expired else "")
            self.failing = True
            return True
        if not updated:
            self.lost = True
            logger.error("agent %s: the turn lease of %s was taken over; stopping this run", self.agent_id, self.owner)
            return False
        if self.failing:
            logger.warning("agent %s: the turn lease is renewed again after the database came back", self.agent_id)
        self.failing = False
        self._renewed = time.monotonic()
        return True

    def release(self) -> None:
        try:
            AgentLease.objects.filter(agent_id=self.agent_id, owner=self.owner).delete()
        except DatabaseError:
            # Down: the lease lapses at its deadline and the sweep hands the agent on.
            connection.close()
            logger.warning("agent %s: could not release the turn lease; it lapses at its deadline", self.agent_id)


def lease_claim(agent_id: int, *, gate: AbstractContextManager[Any] | None = None) -> TurnLease | None:
    """Claim the agent's turn lease for this invocation, or None if a live one is held.
    ``gate`` is held around each renewal's query (never taken by the caller at that time)."""
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
    now = timezone.now()
    until = now + timedelta(milliseconds=settings.AGENTOPS_TURN_LEASE_MS)
    # A lapsed lease is taken over only after a grace, and not within a grace of the database
    # starting: its owner, if alive, renews it first once the database answers again.
    grace_ago = now - timedelta(milliseconds=settings.AGENTOPS_TURN_LEASE_GRACE_MS)
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, [agent_id, owner, until, grace_ago, grace_ago])
        row = cursor.fetchone()
    return TurnLease(agent_id, owner, gate=gate) if row else None
