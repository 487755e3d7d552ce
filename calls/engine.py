"""The provider floor's runtime: the process's runtime with the parts every call needs, each a
named attribute made with it (architecture.md §2, "The runtime").

Everything that makes a call (``calls.run.ProviderCall``, the gate, the breaker's probe, the
turns and the drop-ins above them) is handed a ``CallRuntime``; ``turns.runtime.TurnRuntime``
adds the turns' parts to it.
"""

from __future__ import annotations

from agentops.prices import PriceBook
from agentops.runtime import Part, Runtime
from calls.pacing import Pacer
from calls.progress import ProgressHub
from calls.project_limits import ProjectLimiter


class CallRuntime(Runtime):
    """The runtime with: ``prices`` (the prices' copy, agentops/prices.py), ``pacer`` (the
    providers' stated quotas, §6.13), ``limiter`` (the projects' limits, §6.14) and ``progress``
    (the in-flight calls' progress, §9)."""

    def __init__(self, *, worker: bool) -> None:
        super().__init__(worker=worker)
        self.prices = PriceBook()
        self.pacer = Pacer()
        self.limiter = ProjectLimiter()
        self.progress = ProgressHub(self)

    def parts(self) -> tuple[Part, ...]:
        return (self.progress, self.limiter, self.pacer, self.prices)
