"""The turns' runtime: the provider floor's with the parts that run turns (architecture.md §2,
"The runtime"): the lease renewer, the held agents' re-checks and what the drop-in endpoints
found. A worker's adds its run slots (``turns.drain.WorkerRuntime``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentops.memory import Recent
from agentops.runtime import NoRuntime, Part, installed
from calls.engine import CallRuntime
from turns.holds import Rechecks
from turns.lease import LeaseRenewer

if TYPE_CHECKING:
    from agentops.models import Agent, ApiToken

# Tokens and agents the drop-in endpoints found are kept this long, so a steady client costs no
# query for them: a revoked token, a disposed or changed agent reach those endpoints within
# this many seconds. What was not found is never kept.
FOUND_S = 2.0
FOUND_KEPT = 10_000


class Found:
    """What the drop-in endpoints found: ``tokens`` by the token's hash (the token itself is
    not kept), ``agents`` by (token row, model name)."""

    def __init__(self) -> None:
        self.tokens: Recent[str, ApiToken] = Recent(size=FOUND_KEPT, ttl_s=FOUND_S)
        self.agents: Recent[tuple[int, str], Agent] = Recent(size=FOUND_KEPT, ttl_s=FOUND_S)


class TurnRuntime(CallRuntime):
    """``leases``: one renewal statement a quarter lease for every lease this process holds;
    ``rechecks``: the held agents' re-checks scheduled in this process (and the holds they
    logged); ``found``: the tokens and agents the drop-in endpoints found."""

    def __init__(self, *, worker: bool) -> None:
        super().__init__(worker=worker)
        self.leases = LeaseRenewer(self)
        self.rechecks = Rechecks()
        self.found = Found()

    def parts(self) -> tuple[Part, ...]:
        return (self.leases, self.rechecks, *super().parts())


def running() -> TurnRuntime:
    """The process's runtime, for an entry point that is handed nothing (a Celery task, a
    connection no lifespan served): everything below it is handed the runtime."""
    made = installed()
    if not isinstance(made, TurnRuntime):
        raise NoRuntime(f"this process's runtime is a {type(made).__name__}, not a TurnRuntime")
    return made
