"""Why a call went to the target it did, as a value (architecture.md §6.11, §6.15): the call
row's ``route_kind``, and the routing choice's ``kind``. Its ``route`` keeps the words for a
person ("fallback: primary held until …"); code reads this."""

from __future__ import annotations

from enum import StrEnum


class RouteKind(StrEnum):
    PRIMARY = "primary"  # the agent's own target (also when called as the last resort)
    FALLBACK = "fallback"  # an alternate, the primary held or down
    RETURNING = "returning"  # the primary's first call after an alternate served
    HEDGE = "hedge"  # also sent when the first call produced no content in time
    POOL = "pool"  # a member of the agent's pool, drawn by weight and quota left

    @property
    def alternate(self) -> bool:
        """Whether a call of this kind is served by an alternate (an episode's calls)."""
        return self in (RouteKind.FALLBACK, RouteKind.HEDGE)
