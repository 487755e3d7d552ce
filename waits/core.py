"""The pure core of provider waits (architecture.md §6.2, §6.3): plain values and an explicit
``now``.

No ORM, no I/O, no clock reads. Times are milliseconds since the Unix epoch (UTC).

- ``wait_deadline`` is the deadline rule: ``until = ceil(now + max(0, retry_after_ms))``; a
  value that is not a finite number, or an instant past ``MAX_INSTANT_MS``, holds until
  released (``until is None``); a wait already over records nothing.
- ``WaitBook`` is the reduction: the longest wait per (agent, model, provider) wins, ``None``
  outlasts any instant, ties change nothing, a release removes one model's wait (on one
  provider, or on every provider) or every model's (``*``). Provider ``""`` is the agent's own.
  While the records are unreadable it also knows what a later release made certain again.

The journal's entries, their validation and the names they use are ``waits.entries``, and are
importable from here too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .entries import (
    AGENT_NAME_LIMIT,
    EVERY_AGENT,
    EVERY_MODEL,
    KINDS,
    MAX_INSTANT_MS,
    MODEL_NAME_LIMIT,
    PROVIDER_NAME_LIMIT,
    Entry,
    Kind,
    Malformed,
    Scope,
    Source,
    Wait,
    entry_parse,
    name_problem,
    wait_snapshot,
)

# Names of waits.entries that callers import from here (the journal rows as values).
__all__ = [
    "AGENT_NAME_LIMIT",
    "EVERY_AGENT",
    "EVERY_MODEL",
    "KINDS",
    "MAX_INSTANT_MS",
    "MODEL_NAME_LIMIT",
    "PROVIDER_NAME_LIMIT",
    "Entry",
    "Kind",
    "Malformed",
    "Scope",
    "Source",
    "Wait",
    "entry_parse",
    "name_problem",
    "wait_snapshot",
]

# --- the deadline rule (§6.2) ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Deadline:
    """What a stated wait means at ``now``: ``over`` (record nothing), or hold until ``until``
    (``None``: until released)."""

    until: int | None
    over: bool


def wait_deadline(*, now_ms: float, retry_after_ms: object) -> Deadline:
    """Apply the deadline rule to a provider's stated wait.

    A finite wait of zero or less (a provider's "retry now", a date already past, even -1e20)
    is over: it records nothing. The clamp is on the duration, so a huge negative lands on
    ``now`` rather than overflowing into the indefinite case. Anything that is not a finite
    number (NaN, ±∞, a string, a bool, None) or a deadline past ``MAX_INSTANT_MS`` holds until
    released.
    """
    if isinstance(retry_after_ms, bool) or not isinstance(retry_after_ms, int | float):
        return Deadline(until=None, over=False)
    try:
        stated = float(retry_after_ms)
    except OverflowError:  # an int too large for a float: a huge negative is over, too
        if retry_after_ms < 0:
            return Deadline(until=math.ceil(now_ms), over=True)
        return Deadline(until=None, over=False)
    if math.isnan(stated) or math.isinf(stated):
        return Deadline(until=None, over=False)
    if stated <= 0:
        return Deadline(until=math.ceil(now_ms), over=True)
    total = now_ms + stated
    if not math.isfinite(total) or total > MAX_INSTANT_MS:
        return Deadline(until=None, over=False)
    return Deadline(until=math.ceil(total), over=False)


def wait_binds(until: int | None, now_ms: float) -> bool:
    """A wait binds while it is held until released or its deadline is still ahead. At
    exactly ``until`` it has passed."""
    return until is None or until > now_ms


def outlasts(a: int | None, b: int | None) -> bool:
    """Whether a hold until ``a`` ends strictly later than one until ``b``."""
    if a is None:
        return b is not None
    return b is not None and a > b


# --- the reduction (§6.3) ------------------------------------------------------------------


def set_changes(current: Wait | None, until: int | None) -> bool:
    """Whether a wait until ``until`` replaces ``current``: the longest wait wins, ``None``
    outlasts any instant, ties change nothing."""
    return current is None or outlasts(until, current.until)


@dataclass(frozen=True, slots=True)
class Applied:
    """What one entry did: ``changed`` for a set (False when an equal or longer wait already
    stood), ``lifted`` for a release (the waits it removed)."""

    changed: bool = False
    lifted: tuple[Wait, ...] = ()


@dataclass(frozen=True, slots=True)
class Unreadable:
    """Why the records are unreadable: the first malformed row (or a read failure)."""

    row_id: Any
    problem: str

    def describe(self) -> str:
        return self.problem if self.row_id is None else f"row {self.row_id}: {self.problem}"


@dataclass
class WaitBook:
    """The reduction of journal entries: {agent: {(model, provider): Wait}}.

    When a row could not be read (``unreadable`` is set), nothing is known about any
    (agent, model) except what a later release made certain: ``known_agents`` (released for
    every model) and ``known_pairs`` (released for one model) since the last unreadable row.
    Waits set after such a release are tracked as usual.
    """

    waits: dict[str, dict[tuple[str, str], Wait]] = field(default_factory=dict)
    unreadable: Unreadable | None = None
    known_agents: set[str] = field(default_factory=set)
    known_pairs: set[tuple[str, str]] = field(default_factory=set)
    # Operators' own holds by id (§6.12): only their own lift ends them, never a release.
    holds: dict[str, Wait] = field(default_factory=dict)

    @property
    def readable(self) -> bool:
        return self.unreadable is None

    def copy(self) -> WaitBook:
        return WaitBook(
            waits={agent: dict(models) for agent, models in self.waits.items()},
            unreadable=self.unreadable,
            known_agents=set(self.known_agents),
            known_pairs=set(self.known_pairs),
            holds=dict(self.holds),
        )

    def apply(self, entry: Entry, *, source: Source = "recorded") -> Applied:
        if entry.kind == "set":
            return self._set(entry, source)
        if entry.kind == "release":
            return self._release(entry)
        if entry.kind == "hold":
            self.holds[entry.ref] = _wait_of(entry, source)
            return Applied(changed=True)
        if entry.kind == "lift":
            lifted = self.holds.pop(entry.ref, None)
            return Applied(lifted=(lifted,) if lifted else ())
        # A checkpoint is the reduction of everything before it: it replaces the book.
        self.waits = {}
        for wait in entry.waits:
            self.waits.setdefault(wait.agent, {})[(wait.model, wait.provider)] = wait
        self.holds = {hold.ref: hold for hold in entry.holds}
        self.unreadable = None
        self.known_agents.clear()
        self.known_pairs.clear()
        return Applied(changed=True)

    def _set(self, entry: Entry, source: Source) -> Applied:
        models = self.waits.setdefault(entry.agent, {})
        key = (entry.model, entry.provider)
        if not set_changes(models.get(key), entry.until):
            return Applied(changed=False)
        models[key] = _wait_of(entry, source)
        return Applied(changed=True)

    def _release(self, entry: Entry) -> Applied:
        if entry.agent == EVERY_AGENT:
            return self._release_scoped(entry)
        models = self.waits.get(entry.agent, {})
        if entry.model == EVERY_MODEL:
            lifted = tuple(models.values())
            self.waits.pop(entry.agent, None)
            if self.unreadable:
                self.known_agents.add(entry.agent)
            return Applied(lifted=lifted)
        # A release names one provider's hold, or ("") the model's on every provider.
        keys = [key for key in models if key[0] == entry.model and entry.provider in ("", key[1])]
        lifted = tuple(models.pop(key) for key in keys)
        if not models:
            self.waits.pop(entry.agent, None)
        if self.unreadable and not entry.provider:
            self.known_pairs.add((entry.agent, entry.model))
        return Applied(lifted=lifted)

    def _release_scoped(self, entry: Entry) -> Applied:
        """A release of a provider's scoped waits (§6.12): the model's (or, for ``*``, every
        one), on that provider only. An acceleration cooldown is shortened, never lifted: a
        release covering the model whose stated wait lengthened it takes it back to the
        service's own pacing, and a release of another model leaves it as it was."""
        models = self.waits.get(EVERY_AGENT, {})
        lifted: list[Wait] = []
        for key in [k for k in models if k[1] == entry.provider]:
            wait = models[key]
            if wait.own_until is not None:
                if wait.lengthened_by and entry.model in (EVERY_MODEL, wait.lengthened_by):
                    shorter = (
                        wait.own_until if wait.until is None else min(wait.until, wait.own_until)
                    )
                    models[key] = replace(wait, until=shorter, lengthened_by="")
                    lifted.append(wait)
                continue
            if entry.model in (EVERY_MODEL, key[0]):
                lifted.append(models.pop(key))
        if not models:
            self.waits.pop(EVERY_AGENT, None)
        return Applied(lifted=tuple(lifted))

    def binding_on(
        self, *, agent: str, model: str, provider: str, provider_name: str, now_ms: float
    ) -> Wait | None:
        """The longest wait that binds a call of ``agent`` to ``model`` on a provider at
        ``now`` (``provider`` as the agent's rows name it, "" for its own; ``provider_name``
        its real name): the agent's own wait, the model's on the provider, the provider's,
        or an operator's hold that covers the call."""
        found = [
            self.lookup(agent, model, provider),
            self.lookup(EVERY_AGENT, model, provider_name),
            self.lookup(EVERY_AGENT, EVERY_MODEL, provider_name),
            *(
                hold
                for hold in self.holds.values()
                if hold.provider == provider_name
                and hold.model in (model, EVERY_MODEL)
                and hold.agent in (agent, EVERY_AGENT)
            ),
        ]
        longest: Wait | None = None
        for wait in found:
            if wait is not None and wait_binds(wait.until, now_ms):
                if longest is None or outlasts(wait.until, longest.until):
                    longest = wait
        return longest

    @property
    def scoped_known(self) -> bool:
        """Whether any scoped wait or operator hold is kept (bound or not)."""
        return EVERY_AGENT in self.waits or bool(self.holds)

    def scoped_binding(self, now_ms: float) -> list[Wait]:
        """Every scoped wait and operator hold that binds at ``now``."""
        scoped = [*self.waits.get(EVERY_AGENT, {}).values(), *self.holds.values()]
        return [w for w in scoped if wait_binds(w.until, now_ms)]

    def mark_unreadable(self, row_id: Any, problem: str) -> None:
        """A row could not be read: from here on nothing is known until a release says so.
        The first cause is kept; it is the one to repair first."""
        if self.unreadable is None:
            self.unreadable = Unreadable(row_id=row_id, problem=problem)
        self.known_agents.clear()
        self.known_pairs.clear()

    def unknown(self, agent: str, model: str) -> bool:
        """Whether (agent, model) is held because the records are unreadable."""
        return (
            self.unreadable is not None
            and agent not in self.known_agents
            and (agent, model) not in self.known_pairs
        )

    def lookup(self, agent: str, model: str, provider: str = "") -> Wait | None:
        models = self.waits.get(agent)
        return models.get((model, provider)) if models else None

    def binding(self, now_ms: float) -> Iterator[Wait]:
        """Every recorded wait that binds at ``now`` (the unreadable hold is not a wait)."""
        for models in self.waits.values():
            for wait in models.values():
                if wait_binds(wait.until, now_ms):
                    yield wait

    def agent_binding(self, agent: str, now_ms: float) -> list[Wait]:
        return [w for w in self.waits.get(agent, {}).values() if wait_binds(w.until, now_ms)]


def _wait_of(entry: Entry, source: Source) -> Wait:
    return Wait(
        agent=entry.agent,
        model=entry.model,
        until=entry.until,
        reason=entry.reason,
        set_at=entry.at,
        source=source,
        provider=entry.provider,
        own_until=entry.own_until,
        lengthened_by=entry.lengthened_by,
        ref=entry.ref,
    )


def journal_reduce(rows: Iterable[Mapping[str, Any]], book: WaitBook | None = None) -> WaitBook:
    """Reduce journal rows, in journal order, onto ``book`` (a fresh one by default). A row
    that is not well-formed makes the records unreadable; later rows still apply."""
    book = book if book is not None else WaitBook()
    for row in rows:
        try:
            entry = entry_parse(row)
        except Malformed as exc:
            book.mark_unreadable(exc.row_id, exc.problem)
            continue
        book.apply(entry)
    return book


def pending_overlay(book: WaitBook, acts: Iterable[Entry]) -> WaitBook:
    """What binds: the durable book with this process's pending acts applied in order."""
    acts = list(acts)
    if not acts:
        return book
    binding = book.copy()
    for act in acts:
        binding.apply(act, source="pending")
    return binding


def hold_level(until: int | None, *, now_ms: float, alert_ms: float) -> int:
    """How loud a hold is: 0 none or pacing, 1 longer than ``alert_ms``, 2 until released.
    A wait alerts when an act raises the level (§6.7), so each long hold alerts once."""
    if until is None:
        return 2
    return 1 if until - math.ceil(now_ms) > alert_ms else 0
