"""Running an agent's turns: one at a time per agent, across any number of workers
(architecture.md §5.1).

Exclusivity is the agent's turn lease (``turns.lease``): a run takes the agent's turns only
while it holds the lease, which the runtime's renewer keeps alive. A worker that dies stops
renewing; the lease lapses and the next delivery (the beat sweep) resumes the turn it left
``running``. A duplicate delivery to another worker finds the lease held, or the turn ended,
and does nothing.

The Celery task hands the agent to the runtime (``agent_drain``) and returns: each agent's run
is a coroutine on the runtime's loop, and a worker holds at most ``AGENTOPS_WORKER_TURNS`` of
them (``Runs``, the runtime's run slots). Each turn runs as ``turns.turn_run.TurnRun``'s steps.
A warm shutdown waits for every run to end (``Runtime.wait_idle``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.utils import timezone

from agentops.runtime import UNREACHABLE, LeaseLost, Part, Runtime, Wake, backoff_delays
from inference.models import Turn
from turns.durable import offer_pending_waits, offer_pending_waits_until
from turns.lease import TurnLease, lease_claim
from turns.queue import enqueue_drain
from turns.runtime import TurnRuntime
from turns.turn_run import Outcome, TurnRun

logger = logging.getLogger(__name__)


# The agent's first turn that is not ended, with its status and earliest instant: one
# statement on the hot path of every run (hand-written: the ORM's query building costs more CPU
# than the statement itself).
_NEXT_TURN_SQL = f"""
SELECT id, status, not_before FROM {Turn._meta.db_table}
WHERE agent_id = %s AND status = ANY(%s) ORDER BY id LIMIT 1
"""
_OPEN = [str(s) for s in Turn.OPEN]


def next_turn(agent_id: int, *, now: datetime) -> tuple[int, str] | None:
    """The agent's next turn to run and its status, or None. Turns run in order: a turn waiting
    for tool results blocks the turns behind it (their request would carry a tool call without
    its result), and so does a queued turn that may not run before a later instant (a re-arm).
    A held turn is returned: running it starts with the admission check."""
    with connection.cursor() as cursor:
        cursor.execute(_NEXT_TURN_SQL, [agent_id, _OPEN])
        first = cursor.fetchone()
    if first is None:
        return None
    turn_id, status, not_before = first
    if status == Turn.Status.REQUIRES_ACTION:
        return None
    if status == Turn.Status.QUEUED and not_before is not None and not_before > now:
        return None
    return int(turn_id), str(status)


def agent_drain(rt: WorkerRuntime, agent_id: int) -> None:
    """Hand the agent's queued turns to the worker's runtime to run in order, and return (the
    Celery task's body). While it runs ``AGENTOPS_WORKER_TURNS`` agents this waits for one to
    end, so a full worker takes no more work from the broker."""
    if rt.stopping.is_set():
        return  # a worker shutting down takes no new turns; the sweep re-enqueues them
    rt.submit(rt.runs.hand_over(agent_id)).result()


class WorkerRuntime(TurnRuntime):
    """A worker's runtime: the turns' with its run slots (``runs``)."""

    def __init__(self) -> None:
        super().__init__(worker=True)
        self.runs = Runs(self)

    def parts(self) -> tuple[Part, ...]:
        return (self.runs, *super().parts())


class Runs:
    """The agents whose turns run on this runtime (each with whether a delivery came while it
    ran: it looks again before it ends), and the run slots. Every method runs on the loop."""

    def __init__(self, runtime: TurnRuntime) -> None:
        self.runtime = runtime
        self.slots = asyncio.Semaphore(settings.AGENTOPS_WORKER_TURNS)
        self.again: dict[int, bool] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # the loop keeps only weak references

    async def stop(self) -> None:
        pass  # a run ends on its own: the warm shutdown waits for it (``Runtime.wait_idle``)

    async def hand_over(self, agent_id: int) -> None:
        """Start the agent's run, or tell the one going to look again before it ends."""
        if agent_id in self.again:
            self.again[agent_id] = True
            return
        if not await self._slot():
            return
        if agent_id in self.again:  # handed over by another delivery while this one waited
            self.again[agent_id] = True
            self.slots.release()
            return
        self.again[agent_id] = False
        self.runtime.work_started()
        task = asyncio.get_running_loop().create_task(self._runs(agent_id))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _slot(self) -> bool:
        """A run slot, once one is free; False when the warm shutdown begins first."""
        if not self.slots.locked():
            await self.slots.acquire()
            return True
        stopping = Wake(self.runtime.loop)
        undo = self.runtime.wake_on_shutdown(stopping)
        acquired = asyncio.ensure_future(self.slots.acquire())
        stopped = asyncio.ensure_future(_woken(stopping))
        try:
            await asyncio.wait([acquired, stopped], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the loop is stopping: no slot may stay taken
            if acquired.done() and not acquired.cancelled():
                self.slots.release()
            acquired.cancel()
            raise
        finally:
            undo()
            stopped.cancel()
        if not acquired.done():
            acquired.cancel()
            return False
        if self.runtime.stopping.is_set():
            self.slots.release()
            return False
        return True

    async def _runs(self, agent_id: int) -> None:
        """Run the agent while it has turns; once more if a delivery came meanwhile, however
        the run ended (a release's wake-up for a turn the run had just held, a turn submitted
        after its claim found another worker's lease and before that worker looked again)."""
        try:
            while True:
                await _agent_run(self.runtime, agent_id)
                if not self.again.get(agent_id) or self.runtime.stopping.is_set():
                    return
                self.again[agent_id] = False
        except Exception:
            logger.exception(
                "agent %s: its run stopped on an error; the sweep hands it on", agent_id
            )
        finally:
            self.again.pop(agent_id, None)
            self.slots.release()
            self.runtime.work_ended()


async def _woken(wake: Wake) -> bool:
    await wake.future
    return True


async def _agent_run(rt: TurnRuntime, agent_id: int) -> None:
    """Run the agent's queued turns in order while this run holds its lease."""
    lease = await rt.db(lease_claim, rt.leases, agent_id)
    if lease is None:
        logger.debug("agent %s: another worker holds its turn lease", agent_id)
        return
    idle = False
    try:
        while not lease.lost and not rt.stopping.is_set():
            found = await rt.db_durably(
                lambda: next_turn(agent_id, now=timezone.now()),
                what=f"agent {agent_id}: find its next turn",
                still_ours=lease.renew_if_due,
                recovered=offer_pending_waits,
            )
            if found is None:
                idle = True
                break
            turn_id, status = found
            try:
                outcome = await TurnRun(rt, lease, turn_id, status).run()
            except UNREACHABLE:
                # Lost in a hop that is not retried where it is (the breaker's): the turn is
                # looked for again, from the top, once the database answers.
                logger.warning(
                    "agent %s turn %s: the database did not answer; looking again",
                    agent_id,
                    turn_id,
                )
                await asyncio.sleep(next(backoff_delays()))
                continue
            if outcome is Outcome.HELD:
                break  # its re-check is scheduled; the turns behind it wait with it
            if outcome is Outcome.STOPPED and await _status_held(rt, lease, turn_id):
                break
    except LeaseLost:
        logger.error(
            "agent %s: the turn lease was taken over while the database was down; this run stops",
            agent_id,
        )
    finally:
        await run_end(rt, lease, idle=idle)


async def _status_held(rt: Runtime, lease: TurnLease, turn_id: int) -> bool:
    status = await rt.db_durably(
        lambda: Turn.objects.filter(pk=turn_id).values_list("status", flat=True).first(),
        what=f"turn {turn_id}: read its status",
        still_ours=lease.renew_if_due,
    )
    return status == Turn.Status.HELD


async def run_end(rt: Runtime, lease: TurnLease, *, idle: bool) -> None:
    """End a run: release the agent's lease and, when the run ran out of turns (``idle``),
    look once more. A turn submitted between the run's last look and the release was
    delivered to a worker that found the lease still held and did nothing: without this look
    it would wait for the sweep."""
    await rt.db(lease.release)
    # A run that ends, even one whose lease was taken, hands its stated waits to the journal:
    # the run that takes over must not call before their end.
    await offer_pending_waits_until(rt, time.monotonic() + settings.AGENTOPS_TURN_LEASE_MS / 1000)
    if idle:  # held, stopped or taken over: its own re-check, the sweep or the new owner goes on
        await rt.db(_look_again, lease.agent_id)


def _look_again(agent_id: int) -> None:
    try:
        if next_turn(agent_id, now=timezone.now()) is not None:
            enqueue_drain(agent_id)
    except UNREACHABLE:
        connection.close()  # the sweep hands the agent on
