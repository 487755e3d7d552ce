"""What watches a call on the runtime's loop (architecture.md §9): what it is made under
(``Holding``, a turn's lease), what may abort it (``Watch``), and what its reading tells the
rest of the service as it goes (``Hooks``: the cancel watch and wakes, the turn's live events,
its entry among the dashboard's calls in flight). ``calls.run.ProviderCall`` runs a call under
them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from agentops.live import publish_turn_event
from agentops.runtime import Settable, Wake
from calls.bounds import Deadline
from calls.client import Timeline
from calls.engine import CallRuntime
from calls.progress import progress_entry
from inference.models import InferenceCall


class Holding(Protocol):
    """What a call is made under and must stop without (a turn's lease): kept alive by someone
    else (the process's lease renewer), it wakes a waiting call when it is lost."""

    @property
    def lost(self) -> bool: ...

    def wake_on_loss(self, event: Settable) -> Callable[[], None]:
        """Set ``event`` once lost (at once if it is); returns the undo."""
        ...


@dataclass(frozen=True)
class Watch:
    """What watches a call on the runtime's loop (a turn's call, a probe): it is
    aborted when the Redis key ``abort_key`` appears, when ``holding`` is lost and, with
    ``abort_on_shutdown``, when the worker's warm shutdown begins (a turn's call is left to end:
    the worker waits for it); it has its entry among the dashboard's calls in flight; with
    ``turn_events`` the turn's websocket gets ``call.started``, ``call.delta`` and
    ``call.ended``."""

    abort_key: str | None = None
    holding: Holding | None = None
    abort_on_shutdown: bool = True
    turn_events: bool = False


class Hooks:
    """What a watched call's reading tells the rest of the service: its cancel watch and
    wakes, its live events, its entry on the dashboard. (Methods rather than closures: a worker
    holds thousands of calls at once.)"""

    __slots__ = (
        "aborts",
        "agent",
        "call_id",
        "deadline",
        "engine",
        "firsts",
        "hub",
        "row",
        "timeline",
        "turn_id",
        "undo",
        "watch",
    )

    def __init__(
        self,
        engine: CallRuntime,
        row: InferenceCall,
        agent: str,
        aborts: list[Callable[[], None]],
        watch: Watch,
    ) -> None:
        self.engine, self.row, self.agent, self.watch = engine, row, agent, watch
        self.aborts = aborts  # the call's own: ``ProviderCall.abort`` ends what is here
        self.turn_id = row.turn_id if watch.turn_events else None
        self.call_id: int = row.pk  # read at every event: a model's pk is a property lookup
        self.undo: list[Callable[[], None]] = []
        self.hub = engine.progress
        self.firsts = (False, False)  # first event, first content: sent at once
        self.timeline: Timeline | None = None
        self.deadline: Deadline | None = None

    def on_abortable(self, abort: Callable[[], None]) -> None:
        self.aborts.append(abort)
        watch = self.watch
        if watch.abort_key is not None:
            self.undo.append(self.engine.watch_cancel(watch.abort_key, abort))
        # Woken from another thread (the renewer that found the lease taken, a warm shutdown).
        wake = Wake(self.engine.loop)
        wake.future.add_done_callback(lambda _: abort())
        if watch.holding is not None:
            self.undo.append(watch.holding.wake_on_loss(wake))
        if watch.abort_on_shutdown:
            self.undo.append(self.engine.wake_on_shutdown(wake))

    async def on_milestone(self, name: str, timeline: Timeline) -> None:
        if name == "sent" and self.turn_id is not None:
            row = self.row
            publish_turn_event(
                self.turn_id,
                {
                    "type": "call.started",
                    "turn": self.turn_id,
                    "call": row.pk,
                    "model": row.model,
                    "streamed": row.streamed,
                },
            )

    async def on_delta(self, text: str) -> None:
        if self.turn_id is not None:
            publish_turn_event(
                self.turn_id,
                {
                    "type": "call.delta",
                    "turn": self.turn_id,
                    "call": self.row.pk,
                    "text": text,
                },
            )

    def on_progress(self, timeline: Timeline, deadline: Deadline | None) -> None:
        firsts = (timeline.first_event is not None, timeline.first_content is not None)
        urgent, self.firsts = firsts != self.firsts, firsts
        self.timeline, self.deadline = timeline, deadline
        self.hub.update(self.call_id, self, urgent=urgent)

    def progress(self) -> dict[str, Any]:
        """The call's progress as it stands (the hub reads it when it flushes)."""
        assert self.timeline is not None
        return progress_entry(
            call_id=self.call_id,
            agent=self.agent,
            turn_id=self.row.turn_id,
            timeline=self.timeline,
            deadline=self.deadline,
        )

    def ended(self) -> None:
        self.hub.ended(self.call_id)
        for step in self.undo:
            step()
