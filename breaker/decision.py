"""The breaker's pure decision core (architecture.md §7): plain values in, plain values out. No ORM,
no clock, no I/O; the services read the state, call these, and act on the answer."""

from __future__ import annotations

import enum
from typing import Literal

ProbeOutcome = Literal["answered", "error", "cut", "aborted", "deferred"]
ProbeVerdict = Literal["answered", "refused", "unclear"]

# architecture.md §7.2: only a request the provider refuses as malformed may be the history's fault.
SHEDDABLE_TYPE = "invalid_request"
SHEDDABLE_STATUSES: frozenset[int | None] = frozenset({400, 422, None})


class BreakerAction(enum.StrEnum):
    NOTHING = "nothing"  # this failure is not one shedding can help
    PROBE = "probe"  # first sheddable failure of a run: ask without the history first
    SHED = "shed"  # the history is implicated (a probe was answered in this run): shed
    STOP_CAP = "stop_cap"  # shed_cap sheds already in this run
    STOP_EMPTY = "stop_empty"  # nothing presented is left to shed


def failure_may_shed(*, failure_type: str, http_status: int | None) -> bool:
    """True only for an ``invalid_request`` at HTTP 400 or 422, or with no status
    (architecture.md §7.2). Auth, context length, rate limits, server errors, timeouts, 404s and
    unclassified failures are never the history's fault."""
    return failure_type == SHEDDABLE_TYPE and http_status in SHEDDABLE_STATUSES


def breaker_decide(
    *,
    failure_type: str,
    http_status: int | None,
    sheds_this_run: int,
    shed_cap: int,
    probe_answered_this_run: bool,
    rows_left: bool,
) -> BreakerAction:
    """What the breaker does about one failure of a run that has reached the threshold.

    The stops come before the probe: a probe is pointless when no shed could follow it."""
    if not failure_may_shed(failure_type=failure_type, http_status=http_status):
        return BreakerAction.NOTHING
    if sheds_this_run >= shed_cap:
        return BreakerAction.STOP_CAP
    if not rows_left:
        return BreakerAction.STOP_EMPTY
    if not probe_answered_this_run:
        return BreakerAction.PROBE
    return BreakerAction.SHED


def probe_verdict(
    *,
    failure_type: str,
    failure_status: int | None,
    probe_outcome: ProbeOutcome,
    probe_type: str | None,
    probe_status: int | None,
) -> ProbeVerdict:
    """Read the probe's outcome (architecture.md §7.3).

    ``answered``: the request went through without its history, so the history is implicated.
    ``refused``: the probe failed with the failure's own type *and* status, so the request fails
    without its history too. Anything else (a 429, a deferral by our own waits, a cut, an abort,
    another type or status) is ``unclear``: the probe could not tell."""
    if probe_outcome == "answered":
        return "answered"
    if probe_outcome != "error":
        return "unclear"
    if probe_status == 429 or probe_type == "rate_limit":
        # A rate limit says nothing about the request's content.
        return "unclear"
    if probe_type == failure_type and probe_status == failure_status:
        return "refused"
    return "unclear"
