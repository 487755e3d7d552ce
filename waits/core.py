"""The pure core of provider waits (architecture.md §6.2, §6.3, §6.5): plain values and an explicit
``now``.

No ORM, no I/O, no clock reads. Times are milliseconds since the Unix epoch (UTC).

- ``wait_deadline`` is the deadline rule: ``until = ceil(now + max(0, retry_after_ms))``; a
  value that is not a finite number, or an instant past ``MAX_INSTANT_MS``, holds until
  released (``until is None``); a wait already over records nothing.
- ``entry_parse`` validates one journal row; anything that is not a well-formed wait raises
  ``Malformed`` and makes the records unreadable.
- ``WaitBook`` is the reduction: the longest wait per (agent, model, provider) wins, ``None``
  outlasts any instant, ties change nothing, a release removes one model's wait (on one
  provider, or on every provider) or every model's (``*``). Provider ``""`` is the agent's own.
  While the records are unreadable it also knows what a later release made certain again.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

# The last instant a Python ``datetime`` can hold (9999-12-31T23:59:59.999Z). A deadline past it
# cannot be shown or stored as an instant, so it holds until released.
MAX_INSTANT_MS: Final = 253_402_300_799_999
EVERY_MODEL: Final = "*"
# A scoped wait's agent (architecture.md §6.12): every agent that calls its provider.
EVERY_AGENT: Final = "*"
AGENT_NAME_LIMIT: Final = 100  # agentops.models.Agent.name
MODEL_NAME_LIMIT: Final = 200  # agentops.models.Agent.model
PROVIDER_NAME_LIMIT: Final = 100  # agentops.models.Provider.name

Kind = Literal["set", "release", "checkpoint", "hold", "lift"]
# "hold" and "lift": an operator's own hold and its end (§6.12), named by ``ref``.
KINDS: Final = ("set", "release", "checkpoint", "hold", "lift")
Source = Literal["recorded", "pending"]
Scope = Literal["agent", "model", "provider"]


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


# --- journal entries and their validation (§6.5) -------------------------------------------


@dataclass(frozen=True, slots=True)
class Wait:
    """One (agent, model, provider)'s recorded wait. ``set_at`` is when the winning wait was
    stated; ``provider`` "" is the agent's own."""

    agent: str
    model: str
    until: int | None
    reason: str
    set_at: float
    source: Source = "recorded"
    provider: str = ""
    # An acceleration cooldown (§6.12): when the service's own pacing would have ended it, and
    # the model whose stated wait lengthened it past that ("" when none did).
    own_until: int | None = None
    lengthened_by: str = ""
    # An operator's hold: its id (``ref``); "" for a provider's wait.
    ref: str = ""

    @property
    def scope(self) -> Scope:
        """Whom the wait binds: one agent, every agent on a provider's model, or every agent
        and model on a provider."""
        if self.agent != EVERY_AGENT:
            return "agent"
        return "provider" if self.model == EVERY_MODEL else "model"


@dataclass(frozen=True, slots=True)
class Entry:
    """A well-formed journal entry, or a pending act of this process (``id is None``)."""

    kind: Kind
    agent: str
    model: str
    until: int | None = None
    reason: str = ""
    at: float = 0.0
    id: int | None = None
    waits: tuple[Wait, ...] = ()  # a checkpoint's snapshot
    provider: str = ""  # a set's provider ("" the agent's own); a release's ("" every one)
    own_until: int | None = None  # an acceleration cooldown's own pacing (§6.12)
    lengthened_by: str = ""
    ref: str = ""  # an operator hold's id (a hold's own, a lift's target)
    holds: tuple[Wait, ...] = ()  # a checkpoint's operator holds

    def data(self) -> dict[str, Any]:
        """What the row keeps in ``data`` beside its columns (the inverse of ``entry_parse``)."""
        out: dict[str, Any] = {}
        if self.own_until is not None:
            out["own_until"] = self.own_until
        if self.lengthened_by:
            out["lengthened_by"] = self.lengthened_by
        if self.ref:
            out["ref"] = self.ref
        return out


class Malformed(ValueError):
    """A journal row that is not a well-formed wait. ``problem`` says what, for the operator."""

    def __init__(self, row_id: Any, problem: str) -> None:
        super().__init__(f"journal row {row_id}: {problem}")
        self.row_id = row_id
        self.problem = problem


def name_problem(value: object, *, limit: int, every_model: bool = False) -> str | None:
    """Why ``value`` is not a usable agent or model name, or None if it is. ``*`` is allowed
    only where it means every model."""
    if not isinstance(value, str):
        return f"must be a string, not {_type_name(value)}"
    if not value.strip():
        return "must not be empty"
    if any(unicodedata.category(ch) in ("Cc", "Zl", "Zp") for ch in value):
        return "must not contain control characters"
    if any(unicodedata.category(ch) == "Cs" for ch in value):
        return "must not contain lone surrogates (not valid Unicode text)"
    if len(value) > limit:
        return f"must be at most {limit} characters"
    if value == EVERY_MODEL and not every_model:
        return '"*" is not a name here'
    return None


def _type_name(value: object) -> str:
    if value is None:
        return "null"
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        list: "a list",
        dict: "an object",
    }.get(type(value), type(value).__name__)


def _instant(value: object) -> float | None:
    """A finite millisecond instant within range, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0 or value > MAX_INSTANT_MS:
        return None
    return float(value)


def _until(value: object, row_id: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INSTANT_MS:
        raise Malformed(row_id, f"{where}until is not null or an instant in range: {value!r}"[:300])
    return value


def _name(
    row: Mapping[str, Any],
    key: str,
    row_id: Any,
    *,
    limit: int,
    every_model: bool = False,
    where: str = "",
) -> str:
    if key not in row:
        raise Malformed(row_id, f"{where}{key} is missing")
    value = row[key]
    problem = name_problem(value, limit=limit, every_model=every_model)
    if problem:
        raise Malformed(row_id, f"{where}{key} {problem}")
    return str(value)


def entry_parse(row: Mapping[str, Any]) -> Entry:
    """Validate one journal row (its columns as a mapping, ``at_ms`` in milliseconds and
    ``data`` the JSON payload) and return it as an ``Entry``.

    Raises ``Malformed`` for an unknown kind, a missing or invalid field the reduction or its
    readers use, a deadline out of range, a checkpoint without a snapshot, or a snapshot that
    lists one (agent, model) twice. A release's ``by`` and ``at`` are never read back, so they
    are not required. A scoped row (agent ``*``: §6.12) names its provider.
    """
    row_id = row.get("id")
    kind = row.get("kind")
    if kind not in KINDS:
        raise Malformed(row_id, f"unknown kind {kind!r}"[:300])
    data = row.get("data")
    data = data if isinstance(data, Mapping) else {}
    if kind == "checkpoint":
        return Entry(
            kind="checkpoint",
            agent="",
            model="",
            id=row_id,
            waits=_snapshot(row.get("data"), row_id),
            holds=_snapshot(row.get("data"), row_id, key="holds"),
        )
    if kind == "lift":
        return Entry(kind="lift", agent="", model="", id=row_id, ref=_ref(data, row_id))
    agent = _name(row, "agent", row_id, limit=AGENT_NAME_LIMIT, every_model=True)
    provider = _provider(row, row_id)
    if agent == EVERY_AGENT and not provider:
        raise Malformed(row_id, 'agent "*" (every agent) without a provider')
    if kind == "release":
        model = _name(row, "model", row_id, limit=MODEL_NAME_LIMIT, every_model=True)
        return Entry(kind="release", agent=agent, model=model, id=row_id, provider=provider)
    model = _name(
        row,
        "model",
        row_id,
        limit=MODEL_NAME_LIMIT,
        every_model=agent == EVERY_AGENT or kind == "hold",
    )
    if "until_ms" not in row:
        raise Malformed(row_id, "until is missing")
    until = _until(row["until_ms"], row_id, "")
    reason = row.get("reason")
    if not isinstance(reason, str):
        raise Malformed(row_id, "reason is missing")
    at = _instant(row.get("at_ms"))
    if at is None:
        raise Malformed(row_id, "at is missing or out of range")
    own_until, lengthened_by = _cooldown(data, row_id, "")
    return Entry(
        kind=kind,
        agent=agent,
        model=model,
        until=until,
        reason=reason,
        at=at,
        id=row_id,
        provider=provider,
        own_until=own_until,
        lengthened_by=lengthened_by,
        ref=_ref(data, row_id) if kind == "hold" else "",
    )


def _ref(data: Mapping[str, Any], row_id: Any, where: str = "") -> str:
    ref = data.get("ref")
    if not isinstance(ref, str) or not ref or len(ref) > 64:
        raise Malformed(row_id, f"{where}an operator hold without its ref")
    return ref


def _cooldown(data: Mapping[str, Any], row_id: Any, where: str) -> tuple[int | None, str]:
    """An acceleration cooldown's own pacing and the model that lengthened it, if any."""
    own = _until(data.get("own_until"), row_id, f"{where}own_") if "own_until" in data else None
    by = data.get("lengthened_by", "")
    if by:
        by = _name(data, "lengthened_by", row_id, limit=MODEL_NAME_LIMIT, where=where)
    return own, by


def _provider(row: Mapping[str, Any], row_id: Any, where: str = "") -> str:
    """A row's provider: absent or "" (the agent's own, as in rows before alternates), or a
    usable name."""
    if not row.get("provider"):
        return ""
    return _name(row, "provider", row_id, limit=PROVIDER_NAME_LIMIT, where=where)


def _snapshot(data: object, row_id: Any, *, key: str = "waits") -> tuple[Wait, ...]:
    if not isinstance(data, Mapping):
        raise Malformed(row_id, "a checkpoint without a snapshot (data.waits is not a list)")
    if key == "holds" and key not in data:  # checkpoints written before operator holds
        return ()
    if not isinstance(data.get(key), list):
        raise Malformed(row_id, f"a checkpoint without a snapshot (data.{key} is not a list)")
    seen: set[tuple[str, str, str]] = set()
    waits = []
    for index, item in enumerate(data[key]):
        where = f"snapshot {key[:-1]} {index}: "
        if not isinstance(item, Mapping):
            raise Malformed(row_id, f"{where}not an object")
        agent = _name(item, "agent", row_id, limit=AGENT_NAME_LIMIT, where=where, every_model=True)
        provider = _provider(item, row_id, where)
        if agent == EVERY_AGENT and not provider:
            raise Malformed(row_id, f'{where}agent "*" (every agent) without a provider')
        model = _name(
            item,
            "model",
            row_id,
            limit=MODEL_NAME_LIMIT,
            where=where,
            every_model=agent == EVERY_AGENT or key == "holds",
        )
        ref = _ref(item, row_id, where) if key == "holds" else ""
        if key == "holds":
            agent_key: tuple[str, str, str] = (ref, "", "")
        else:
            agent_key = (agent, model, provider)
        if agent_key in seen:
            raise Malformed(row_id, f"{where}({agent!r}, {model!r}) is listed twice"[:300])
        seen.add(agent_key)
        if "until" not in item:
            raise Malformed(row_id, f"{where}until is missing")
        until = _until(item["until"], row_id, where)
        if not isinstance(item.get("reason"), str):
            raise Malformed(row_id, f"{where}reason is missing")
        set_at = _instant(item.get("set_at"))
        if set_at is None:
            raise Malformed(row_id, f"{where}set_at is missing or out of range")
        own_until, lengthened_by = _cooldown(item, row_id, where)
        waits.append(
            Wait(
                agent=agent,
                model=model,
                until=until,
                reason=item["reason"],
                set_at=set_at,
                provider=provider,
                own_until=own_until,
                lengthened_by=lengthened_by,
                ref=ref,
            )
        )
    return tuple(waits)


def wait_snapshot(wait: Wait) -> dict[str, Any]:
    """A wait as a checkpoint lists it (the inverse of the snapshot's parse); ``provider``
    only for an alternate's, so the agent's own read as before alternates existed."""
    snapshot: dict[str, Any] = {
        "agent": wait.agent,
        "model": wait.model,
        "until": wait.until,
        "reason": wait.reason,
        "set_at": wait.set_at,
    }
    if wait.provider:
        snapshot["provider"] = wait.provider
    if wait.own_until is not None:
        snapshot["own_until"] = wait.own_until
    if wait.lengthened_by:
        snapshot["lengthened_by"] = wait.lengthened_by
    if wait.ref:
        snapshot["ref"] = wait.ref
    return snapshot


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
