"""The pure core at its edges (DESIGN §6.2, §6.3, §6.5): explicit ``now``, no database."""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest

from waits.core import (
    MAX_INSTANT_MS,
    Entry,
    Malformed,
    WaitBook,
    entry_parse,
    hold_level,
    journal_reduce,
    pending_overlay,
    wait_binds,
    wait_deadline,
)

NOW = 1_000_000.0


# --- the deadline rule ------------------------------------------------------------------------


def test_a_zero_wait_is_over_and_records_nothing() -> None:
    deadline = wait_deadline(now_ms=NOW, retry_after_ms=0)
    assert deadline.over
    assert not wait_binds(deadline.until, NOW)


def test_a_fraction_of_a_millisecond_is_rounded_up_to_a_whole_one() -> None:
    deadline = wait_deadline(now_ms=NOW, retry_after_ms=0.4)
    assert not deadline.over
    assert deadline.until == NOW + 1
    assert wait_binds(deadline.until, NOW)
    assert not wait_binds(deadline.until, NOW + 1)


def test_the_deadline_is_rounded_up_from_a_fractional_now() -> None:
    assert wait_deadline(now_ms=NOW + 0.25, retry_after_ms=1000).until == NOW + 1001


@pytest.mark.parametrize("stated", [-1, -1000, -0.4, -0.0, -1e20, -sys.float_info.max, -(10**400)])
def test_a_negative_wait_is_over_and_binds_nothing(stated: float) -> None:
    deadline = wait_deadline(now_ms=NOW, retry_after_ms=stated)
    assert deadline.over
    assert deadline.until == NOW  # the clamp is on the duration: even -1e20 lands on now
    assert not wait_binds(deadline.until, NOW)


@pytest.mark.parametrize("stated", [math.nan, math.inf, -math.inf, "abc", "5000", None, True, [5], {"ms": 5}])
def test_a_wait_that_is_not_a_finite_number_holds_until_released(stated: Any) -> None:
    deadline = wait_deadline(now_ms=NOW, retry_after_ms=stated)
    assert not deadline.over
    assert deadline.until is None
    assert wait_binds(None, NOW) and wait_binds(None, MAX_INSTANT_MS * 10)


@pytest.mark.parametrize("stated", [1e20, 1e15, MAX_INSTANT_MS, 10**400])
def test_a_deadline_past_the_largest_instant_holds_until_released(stated: float) -> None:
    assert wait_deadline(now_ms=NOW, retry_after_ms=stated).until is None


def test_the_largest_instant_itself_is_still_an_instant() -> None:
    assert wait_deadline(now_ms=0, retry_after_ms=MAX_INSTANT_MS).until == MAX_INSTANT_MS
    assert wait_deadline(now_ms=1, retry_after_ms=MAX_INSTANT_MS).until is None


@pytest.mark.parametrize("stated", [1, 1000, 600_000, 86_400_000])
def test_a_wait_binds_one_millisecond_before_its_deadline_and_not_at_it(stated: int) -> None:
    until = wait_deadline(now_ms=NOW, retry_after_ms=stated).until
    assert until == NOW + stated
    assert wait_binds(until, until - 1)
    assert not wait_binds(until, until)
    assert not wait_binds(until, until + 1)


def test_an_hour_exactly_is_pacing_and_a_millisecond_more_is_a_long_hold() -> None:
    hour = 3_600_000
    assert hold_level(wait_deadline(now_ms=NOW, retry_after_ms=hour).until, now_ms=NOW, alert_ms=hour) == 0
    assert hold_level(wait_deadline(now_ms=NOW, retry_after_ms=hour + 1).until, now_ms=NOW, alert_ms=hour) == 1
    assert hold_level(wait_deadline(now_ms=NOW + 0.5, retry_after_ms=hour).until, now_ms=NOW + 0.5, alert_ms=hour) == 0
    assert hold_level(None, now_ms=NOW, alert_ms=hour) == 2


# --- the reduction ----------------------------------------------------------------------------


def set_(agent: str, model: str, until: int | None, *, at: float = NOW, reason: str = "429") -> Entry:
    return Entry(kind="set", agent=agent, model=model, until=until, reason=reason, at=at)


def release(agent: str, model: str = "*") -> Entry:
    return Entry(kind="release", agent=agent, model=model)


def test_the_longest_wait_wins_and_a_later_shorter_one_changes_nothing() -> None:
    book = WaitBook()
    assert book.apply(set_("ada", "m1", 5000, reason="first")).changed
    later_shorter = book.apply(set_("ada", "m1", 3000, at=NOW + 10, reason="second"))
    assert not later_shorter.changed
    wait = book.lookup("ada", "m1")
    assert wait is not None and wait.until == 5000 and wait.reason == "first"
    assert book.apply(set_("ada", "m1", 7000, reason="third")).changed
    assert book.lookup("ada", "m1").until == 7000  # type: ignore[union-attr]


def test_a_tie_changes_nothing_and_keeps_the_first_wait() -> None:
    book = WaitBook()
    book.apply(set_("ada", "m1", 5000, reason="first"))
    assert not book.apply(set_("ada", "m1", 5000, reason="tie")).changed
    assert book.lookup("ada", "m1").reason == "first"  # type: ignore[union-attr]
    book.apply(set_("ada", "m2", None, reason="first"))
    assert not book.apply(set_("ada", "m2", None, reason="tie")).changed


def test_an_indefinite_wait_never_becomes_finite_except_by_release() -> None:
    book = WaitBook()
    book.apply(set_("ada", "m1", None))
    assert not book.apply(set_("ada", "m1", MAX_INSTANT_MS)).changed
    assert book.lookup("ada", "m1").until is None  # type: ignore[union-attr]
    book.apply(release("ada", "m1"))
    assert book.lookup("ada", "m1") is None
    assert book.apply(set_("ada", "m1", 5000)).changed


def test_an_indefinite_wait_outlasts_a_finite_one() -> None:
    book = WaitBook()
    book.apply(set_("ada", "m1", 5000))
    assert book.apply(set_("ada", "m1", None)).changed
    assert book.lookup("ada", "m1").until is None  # type: ignore[union-attr]


def test_a_negative_wait_arriving_over_a_600_s_wait_leaves_it_as_it_was() -> None:
    book = WaitBook()
    first = wait_deadline(now_ms=NOW, retry_after_ms=600_000)
    book.apply(set_("ada", "m1", first.until))
    negative = wait_deadline(now_ms=NOW + 1000, retry_after_ms=-1)
    assert negative.over  # so the service records nothing; and even applied it would not win:
    assert not book.apply(set_("ada", "m1", negative.until, at=NOW + 1000)).changed
    assert book.lookup("ada", "m1").until == NOW + 600_000  # type: ignore[union-attr]


def test_a_release_of_one_model_leaves_the_agents_other_models_and_other_agents() -> None:
    book = WaitBook()
    for agent, model in [("ada", "m1"), ("ada", "m2"), ("bob", "m1")]:
        book.apply(set_(agent, model, 5000))
    lifted = book.apply(release("ada", "m1")).lifted
    assert [(w.agent, w.model) for w in lifted] == [("ada", "m1")]
    assert book.lookup("ada", "m1") is None
    assert book.lookup("ada", "m2") is not None and book.lookup("bob", "m1") is not None


def test_a_release_of_every_model_lifts_all_of_the_agents_waits_and_no_one_elses() -> None:
    book = WaitBook()
    for agent, model in [("ada", "m1"), ("ada", "m2"), ("bob", "m1")]:
        book.apply(set_(agent, model, 5000))
    lifted = book.apply(release("ada", "*")).lifted
    assert sorted(w.model for w in lifted) == ["m1", "m2"]
    assert book.lookup("ada", "m1") is None and book.lookup("ada", "m2") is None
    assert book.lookup("bob", "m1") is not None


def test_a_wait_set_after_a_release_binds_again() -> None:
    book = journal_reduce([row("set", until_ms=5000), row("release", model="*"), row("set", until_ms=4000)])
    assert book.lookup("ada", "m1").until == 4000  # type: ignore[union-attr]


def test_pending_acts_apply_over_the_durable_book_without_changing_it() -> None:
    durable = WaitBook()
    durable.apply(set_("ada", "m1", 5000))
    binding = pending_overlay(durable, [set_("ada", "m2", None), release("ada", "m1")])
    assert binding.lookup("ada", "m1") is None
    assert binding.lookup("ada", "m2").source == "pending"  # type: ignore[union-attr]
    assert durable.lookup("ada", "m1") is not None and durable.lookup("ada", "m2") is None
    assert pending_overlay(durable, []) is durable


def test_a_checkpoint_replaces_what_came_before_it() -> None:
    snapshot = {"waits": [{"agent": "bob", "model": "m9", "until": 9000, "reason": "r", "set_at": NOW}]}
    book = journal_reduce([row("set", until_ms=5000), row("checkpoint", data=snapshot), row("set", agent="cy", until_ms=7000)])
    assert book.lookup("ada", "m1") is None
    assert book.lookup("bob", "m9").until == 9000  # type: ignore[union-attr]
    assert book.lookup("cy", "m1").until == 7000  # type: ignore[union-attr]


# --- validation of rows -----------------------------------------------------------------------


def row(kind: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"id": 1, "kind": kind, "agent": "ada", "model": "m1", "until_ms": None, "reason": "r", "at_ms": NOW, "data": {}}
    return {**base, **fields}


GOOD_WAIT = {"agent": "ada", "model": "m1", "until": 9000, "reason": "r", "set_at": NOW}

MALFORMED = {
    "unknown kind": row("pause"),
    "kind missing": {k: v for k, v in row("set").items() if k != "kind"},
    "agent missing": {k: v for k, v in row("set").items() if k != "agent"},
    "agent empty": row("set", agent=""),
    "agent not a string": row("set", agent=7),
    "model empty": row("set", model=""),
    "model every-model in a set": row("set", model="*"),
    "model with a control character": row("release", model="m\x001"),
    "until missing": {k: v for k, v in row("set").items() if k != "until_ms"},
    "until negative": row("set", until_ms=-5),
    "until past the largest instant": row("set", until_ms=MAX_INSTANT_MS + 1),
    "until a string": row("set", until_ms="soon"),
    "reason missing": row("set", reason=None),
    "at missing": row("set", at_ms=None),
    "checkpoint without a snapshot": row("checkpoint", data={}),
    "checkpoint snapshot not a list": row("checkpoint", data={"waits": {"ada": 1}}),
    "checkpoint with one wait twice": row("checkpoint", data={"waits": [GOOD_WAIT, {**GOOD_WAIT, "until": None}]}),
    "checkpoint wait missing until": row("checkpoint", data={"waits": [{k: v for k, v in GOOD_WAIT.items() if k != "until"}]}),
    "checkpoint wait with a bad deadline": row("checkpoint", data={"waits": [{**GOOD_WAIT, "until": "NaN"}]}),
    "checkpoint wait missing set_at": row("checkpoint", data={"waits": [{k: v for k, v in GOOD_WAIT.items() if k != "set_at"}]}),
}


@pytest.mark.parametrize("shape", MALFORMED)
def test_a_row_that_is_not_a_well_formed_wait_is_refused(shape: str) -> None:
    with pytest.raises(Malformed):
        entry_parse(MALFORMED[shape])


@pytest.mark.parametrize("shape", MALFORMED)
def test_a_malformed_row_makes_the_records_unreadable_and_holds_every_pair(shape: str) -> None:
    book = journal_reduce([row("set", until_ms=5000), {**MALFORMED[shape], "id": 2}])
    assert not book.readable
    assert book.unreadable is not None and book.unreadable.row_id == 2
    assert book.unknown("ada", "m1") and book.unknown("someone-else", "any-model")


def test_well_formed_rows_of_each_kind_read() -> None:
    assert entry_parse(row("set", until_ms=5000)).until == 5000
    assert entry_parse(row("set", until_ms=None)).until is None
    assert entry_parse(row("release", model="*", by=None, at_ms=None)).model == "*"
    assert entry_parse(row("checkpoint", agent="", model="", data={"waits": [GOOD_WAIT]})).waits[0].until == 9000


def test_a_release_after_an_unreadable_row_makes_exactly_what_it_names_certain_again() -> None:
    book = journal_reduce([row("pause", id=1), row("release", id=2, agent="ada", model="m1"), row("release", id=3, agent="bob", model="*")])
    assert not book.readable
    assert not book.unknown("ada", "m1")
    assert book.unknown("ada", "m2")
    assert not book.unknown("bob", "m1") and not book.unknown("bob", "m2")
    assert book.unknown("cy", "m1")
    # a wait set after the release binds as usual; an unreadable row after it makes it unknown again
    journal_reduce([row("set", id=4, agent="bob", model="m1", until_ms=9000)], book)
    assert book.lookup("bob", "m1").until == 9000  # type: ignore[union-attr]
    journal_reduce([row("pause", id=5)], book)
    assert book.unknown("bob", "m1") and book.unreadable.row_id == 1  # type: ignore[union-attr]
