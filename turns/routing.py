"""Which target serves an agent's next call (architecture.md §6.11): the agent's own provider
and model (the primary, index 0) or the first of its alternates that may serve.

Pure: plain values and an explicit ``now``. What is known of each target comes from the
journal (its binding hold) and its latest call rows (whether it is down); ``turns.serving``
reads both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from inference.routes import RouteKind

# A failure of these kinds makes a target down at once: its key or credit is refused, it was
# silent or cut (a silent model is not called twice in a row; a cut answer starts over
# elsewhere), it said "not now" without saying for how long, or its worst case is over what
# the agent's budget has left while a cheaper target's fits (§18.4; never sent).
DOWN_AT_ONCE: Final = frozenset({"auth", "quota", "timeout", "budget_edge"})
# These make it down when its two latest calls both failed so, within the retry interval of
# each other (a lone 5xx may be a blip, and one from long ago says nothing of now).
DOWN_TWICE: Final = frozenset({"server", "overloaded", "network"})
# The failures after which a call goes to another target: never a refusal of the request
# itself (invalid_request, policy, context_length), which another model would refuse too.
SWITCH_ON: Final = DOWN_AT_ONCE | DOWN_TWICE | {"rate_limit"}


@dataclass(frozen=True, slots=True)
class Seen:
    """One target as the journal and its call rows show it at ``now``. ``held``: a wait binds
    it, until ``hold_until`` (None: until released); ``down_until``: its latest failures make
    it down until then (None: not down), for ``down_why``."""

    held: bool = False
    hold_until: int | None = None
    down_until: float | None = None
    down_why: str = ""


@dataclass(frozen=True, slots=True)
class Choice:
    """The target to call (``index`` into primary + alternates), its ``kind`` and why, for its
    call row: ``why`` is what the words of ``reason`` add to the kind (for a fallback, what
    the primary is). ``fresh``: it may serve (not held, not down); False for the primary called
    as the last resort when every target is down (then the retry policy paces the calls)."""

    index: int
    kind: RouteKind = RouteKind.PRIMARY
    why: str = ""
    fresh: bool = True

    @property
    def reason(self) -> str:
        """The choice in words, as the call row's ``route`` and the API show it."""
        if self.kind is RouteKind.RETURNING:
            return "return to primary"
        if self.kind in (RouteKind.PRIMARY, RouteKind.POOL):
            return f"{self.kind} ({self.why})" if self.why else str(self.kind)
        return f"{self.kind}: {self.why}"


# The agent's own target, chosen as it is: what a call goes to before any choice is made.
PRIMARY: Final = Choice(0)


@dataclass(frozen=True, slots=True)
class Failure:
    """A target's ended call as routing reads it: ``kind`` the error type (None: it
    answered), whether its wait was stated, whether content had arrived, when it ended, and
    whether it was a return to the primary after an alternate served."""

    kind: str | None
    stated_wait: bool = False
    after_content: bool = False
    ended_ms: float = 0.0
    returning: bool = False


def down_until(latest: Sequence[Failure], *, retry_after_ms: float) -> tuple[float | None, str]:
    """Until when a target is down after its latest ended calls (newest first), and why."""
    if not latest or latest[0].kind is None:
        return None, ""
    last = latest[0]
    kind = last.kind
    if kind == "rate_limit" and not last.stated_wait:
        why = "a 429 without a stated wait"
    elif kind == "budget_edge":
        why = "its worst case is over what the budget has left"
    elif kind in DOWN_AT_ONCE:
        why = f"a {kind} failure"
    elif kind in DOWN_TWICE and last.after_content:
        why = "its answer was cut after content"
    elif kind in DOWN_TWICE and last.returning:
        # The first call after its down interval: the outage goes on (one call per interval).
        why = f"a {kind} failure on its return"
    elif (
        kind in DOWN_TWICE
        and len(latest) > 1
        and latest[1].kind in DOWN_TWICE
        and last.ended_ms - latest[1].ended_ms <= retry_after_ms
    ):
        why = f"two {kind} failures in a row"
    else:
        return None, ""
    return last.ended_ms + retry_after_ms, why


def smooth_pick(scores: Sequence[float], credit: Sequence[float]) -> tuple[int, list[float]]:
    """One pick of a smooth weighted rotation (nginx's): each member gains its score, the one
    with the most credit is chosen (the first on a tie) and pays the scores' total. Over any
    run of picks each member's share is its score's share to within one pick, and a heavy
    member's picks are spread among the light ones' rather than bunched. Returns the pick and
    the credit to keep for the next."""
    gained = [c + s for c, s in zip(credit, scores, strict=True)]
    pick = max(range(len(gained)), key=gained.__getitem__)
    gained[pick] -= sum(scores)
    return pick, gained


def overflow_need(error_limit: int | None, window: int | None) -> int | None:
    """The tokens a request refused for length counts as at least (§5.9, §6.11): one more than
    the window the refusal stated, else than the refused target's known window; None when
    neither is known (then no other target is known to fit)."""
    limit = error_limit if error_limit is not None else window
    return None if limit is None else limit + 1


def route_choose(seen: Sequence[Seen], *, now_ms: float, fallback_after_ms: float) -> Choice | None:
    """The target for the next call, or None: hold the call on the primary's wait (it is
    short enough to wait out, or nothing else may serve while it binds).

    The primary serves unless a wait binds it for longer than ``fallback_after_ms`` or it is
    down; then the first alternate that is neither held nor down. With none, a held primary
    holds the call, and a primary that is only down is called anyway (``fresh`` False)."""
    primary = seen[0]
    if primary.held and (
        primary.hold_until is not None and primary.hold_until - now_ms <= fallback_after_ms
    ):
        return None
    if not primary.held and not _down(primary, now_ms):
        return Choice(0)
    why = (
        f"primary held {_until_text(primary.hold_until)}"
        if primary.held
        else f"primary down ({primary.down_why})"
    )
    for index, alternate in enumerate(seen[1:], start=1):
        if not alternate.held and not _down(alternate, now_ms):
            return Choice(index, RouteKind.FALLBACK, why)
    if primary.held:
        return None
    return Choice(0, why="every alternate is held or down", fresh=False)


def _down(target: Seen, now_ms: float) -> bool:
    return target.down_until is not None and target.down_until > now_ms


def _until_text(until: int | None) -> str:
    if until is None:
        return "until released"
    return "until " + datetime.fromtimestamp(until / 1000, UTC).isoformat(timespec="seconds")


def alternates(fallbacks: Any) -> list[dict[str, Any]]:
    """The stored alternates, as stored (a list of objects; anything else reads as none)."""
    return [f for f in fallbacks if isinstance(f, dict)] if isinstance(fallbacks, list) else []
