"""The turns' runtime: the provider floor's with the parts that run turns (architecture.md §2,
"The runtime"): the lease renewer and the held agents' re-checks. A worker's adds its run slots
(``turns.drain.WorkerRuntime``)."""

from __future__ import annotations

from agentops.runtime import NoRuntime, Part, installed
from calls.engine import CallRuntime
from turns.holds import Rechecks
from turns.lease import LeaseRenewer


class TurnRuntime(CallRuntime):
    """``leases``: one renewal statement a quarter lease for every lease this process holds;
    ``rechecks``: the held agents' re-checks scheduled in this process."""

    def __init__(self, *, worker: bool) -> None:
        super().__init__(worker=worker)
        self.leases = LeaseRenewer(self)
        self.rechecks = Rechecks()

    def parts(self) -> tuple[Part, ...]:
        return (self.leases, self.rechecks, *super().parts())


def running() -> TurnRuntime:
    """The process's runtime, for an entry point that is handed nothing (a view, a socket's
    consumer, a Celery task): everything below it is handed the runtime."""
    made = installed()
    if not isinstance(made, TurnRuntime):
        raise NoRuntime(f"this process's runtime is a {type(made).__name__}, not a TurnRuntime")
    return made
