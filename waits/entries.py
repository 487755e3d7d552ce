"""Journal entries as values (architecture.md §6.5): a wait, an act, and the validation of
a row read back. Pure: plain values, no ORM, no I/O, no clock reads.

- ``entry_parse`` validates one journal row; anything that is not a well-formed wait raises
  ``Malformed`` and makes the records unreadable;
- ``wait_snapshot`` is a wait as a checkpoint lists it (the inverse of the snapshot's parse).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
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
