"""The pure core at its edges (architecture.md §6.2, §6.3, §6.5): explicit ``now``, no database."""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest

from waits.core import (
    MAX_INSTANT_MS,
    Applied,
    Deadline,
    Entry,
    Malformed,
    Unreadable,
    Wait,
    WaitBook,
    entry_parse,
    hold_level,
    journal_reduce,
    name_problem,
    pending_overlay,
    wait_binds,
    wait_deadline,
    wait_snapshot,
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


@pytest.mark.parametrize(
    "stated", [math.nan, math.inf, -math.inf, "abc", "5000", None, True, [5], {"ms": 5}]
)
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
    assert (
        hold_level(wait_deadline(now_ms=NOW, retry_after_ms=hour).until, now_ms=NOW, alert_ms=hour)
        == 0
    )
    assert (
        hold_level(
            wait_deadline(now_ms=NOW, retry_after_ms=hour + 1).until, now_ms=NOW, alert_ms=hour
        )
        == 1
    )
    assert (
        hold_level(
            wait_deadline(now_ms=NOW + 0.5, retry_after_ms=hour).until,
            now_ms=NOW + 0.5,
            alert_ms=hour,
        )
        == 0
    )
    assert hold_level(None, now_ms=NOW, alert_ms=hour) == 2


# --- the reduction ----------------------------------------------------------------------------


def set_(
    agent: str, model: str, until: int | None, *, at: float = NOW, reason: str = "429"
) -> Entry:
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
    book = journal_reduce(
        [row("set", until_ms=5000), row("release", model="*"), row("set", until_ms=4000)]
    )
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
    snapshot = {
        "waits": [{"agent": "bob", "model": "m9", "until": 9000, "reason": "r", "set_at": NOW}]
    }
    book = journal_reduce(
        [
            row("set", until_ms=5000),
            row("checkpoint", data=snapshot),
            row("set", agent="cy", until_ms=7000),
        ]
    )
    assert book.lookup("ada", "m1") is None
    assert book.lookup("bob", "m9").until == 9000  # type: ignore[union-attr]
    assert book.lookup("cy", "m1").until == 7000  # type: ignore[union-attr]


# --- validation of rows -----------------------------------------------------------------------


def row(kind: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": 1,
        "kind": kind,
        "agent": "ada",
        "model": "m1",
        "until_ms": None,
        "reason": "r",
        "at_ms": NOW,
        "data": {},
    }
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
    "checkpoint with one wait twice": row(
        "checkpoint", data={"waits": [GOOD_WAIT, {**GOOD_WAIT, "until": None}]}
    ),
    "checkpoint wait missing until": row(
        "checkpoint", data={"waits": [{k: v for k, v in GOOD_WAIT.items() if k != "until"}]}
    ),
    "checkpoint wait with a bad deadline": row(
        "checkpoint", data={"waits": [{**GOOD_WAIT, "until": "NaN"}]}
    ),
    "checkpoint wait missing set_at": row(
        "checkpoint", data={"waits": [{k: v for k, v in GOOD_WAIT.items() if k != "set_at"}]}
    ),
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
    assert (
        entry_parse(row("checkpoint", agent="", model="", data={"waits": [GOOD_WAIT]}))
        .waits[0]
        .until
        == 9000
    )


def test_a_release_after_an_unreadable_row_makes_exactly_what_it_names_certain_again() -> None:
    book = journal_reduce(
        [
            row("pause", id=1),
            row("release", id=2, agent="ada", model="m1"),
            row("release", id=3, agent="bob", model="*"),
        ]
    )
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


# --- what a malformed row tells the operator --------------------------------------------------
# The problem is what the alert and the waits page show (``Unreadable.describe``): it names the
# field, and in a checkpoint which listed wait, so the row can be repaired.

LONG = "x" * 400  # a value whose problem is cut to 300 characters
NO_SNAPSHOT = "a checkpoint without a snapshot (data.waits is not a list)"

PROBLEMS: dict[str, tuple[dict[str, Any], str]] = {
    **{
        shape: (MALFORMED[shape], problem)
        for shape, problem in {
            "unknown kind": "unknown kind 'pause'",
            "kind missing": "unknown kind None",
            "agent missing": "agent is missing",
            "agent empty": "agent must not be empty",
            "agent not a string": "agent must be a string, not a number",
            "model empty": "model must not be empty",
            "model every-model in a set": 'model "*" is not a name here',
            "model with a control character": "model must not contain control characters",
            "until missing": "until is missing",
            "until negative": "until is not null or an instant in range: -5",
            "until past the largest instant": (
                f"until is not null or an instant in range: {MAX_INSTANT_MS + 1}"
            ),
            "until a string": "until is not null or an instant in range: 'soon'",
            "reason missing": "reason is missing",
            "at missing": "at is missing or out of range",
            "checkpoint without a snapshot": NO_SNAPSHOT,
            "checkpoint snapshot not a list": NO_SNAPSHOT,
            "checkpoint with one wait twice": "snapshot wait 1: ('ada', 'm1') is listed twice",
            "checkpoint wait missing until": "snapshot wait 0: until is missing",
            "checkpoint wait with a bad deadline": (
                "snapshot wait 0: until is not null or an instant in range: 'NaN'"
            ),
            "checkpoint wait missing set_at": "snapshot wait 0: set_at is missing or out of range",
        }.items()
    },
    "agent whitespace only": (row("set", agent=" \t "), "agent must not be empty"),
    "agent null": (row("set", agent=None), "agent must be a string, not null"),
    "agent a boolean": (row("set", agent=True), "agent must be a string, not a boolean"),
    "agent a fraction": (row("set", agent=1.5), "agent must be a string, not a number"),
    "agent a list": (row("set", agent=["ada"]), "agent must be a string, not a list"),
    "agent an object": (row("set", agent={"name": "ada"}), "agent must be a string, not an object"),
    "agent bytes": (row("set", agent=b"ada"), "agent must be a string, not bytes"),
    "agent with a line separator": (
        row("set", agent="a\u2028da"),
        "agent must not contain control characters",
    ),
    "agent with a paragraph separator": (
        row("set", agent="a\u2029da"),
        "agent must not contain control characters",
    ),
    "agent one character too long": (
        row("set", agent="a" * 101),
        "agent must be at most 100 characters",
    ),
    "model one character too long": (
        row("set", model="m" * 201),
        "model must be at most 200 characters",
    ),
    "agent every-model in a release": (
        row("release", agent="*"),
        'agent "*" (every agent) without a provider',
    ),
    "until a fraction": (
        row("set", until_ms=5000.5),
        "until is not null or an instant in range: 5000.5",
    ),
    "until a boolean": (
        row("set", until_ms=True),
        "until is not null or an instant in range: True",
    ),
    "until long": (
        row("set", until_ms=LONG),
        f"until is not null or an instant in range: {LONG!r}"[:300],
    ),
    "kind long": (row(LONG), f"unknown kind {LONG!r}"[:300]),
    "at negative": (row("set", at_ms=-1), "at is missing or out of range"),
    "at not a number": (row("set", at_ms=math.nan), "at is missing or out of range"),
    "at infinite": (row("set", at_ms=math.inf), "at is missing or out of range"),
    "at past the largest instant": (
        row("set", at_ms=MAX_INSTANT_MS + 1),
        "at is missing or out of range",
    ),
    "at a boolean": (row("set", at_ms=True), "at is missing or out of range"),
    "at a string": (row("set", at_ms="1000"), "at is missing or out of range"),
    "checkpoint wait not an object": (
        row("checkpoint", data={"waits": [GOOD_WAIT, "ada"]}),
        "snapshot wait 1: not an object",
    ),
    "checkpoint wait missing agent": (
        row("checkpoint", data={"waits": [{k: v for k, v in GOOD_WAIT.items() if k != "agent"}]}),
        "snapshot wait 0: agent is missing",
    ),
    "checkpoint wait model null": (
        row("checkpoint", data={"waits": [{**GOOD_WAIT, "model": None}]}),
        "snapshot wait 0: model must be a string, not null",
    ),
    "checkpoint wait missing reason": (
        row("checkpoint", data={"waits": [{k: v for k, v in GOOD_WAIT.items() if k != "reason"}]}),
        "snapshot wait 0: reason is missing",
    ),
    "checkpoint wait set_at negative": (
        row("checkpoint", data={"waits": [{**GOOD_WAIT, "set_at": -1}]}),
        "snapshot wait 0: set_at is missing or out of range",
    ),
    "checkpoint wait with a long deadline": (
        row("checkpoint", data={"waits": [{**GOOD_WAIT, "until": LONG}]}),
        f"snapshot wait 0: until is not null or an instant in range: {LONG!r}"[:300],
    ),
    "checkpoint with one long-named wait twice": (
        row(
            "checkpoint",
            data={"waits": [{**GOOD_WAIT, "agent": "a" * 100, "model": "m" * 200}] * 2},
        ),
        f"snapshot wait 1: ({'a' * 100!r}, {'m' * 200!r}) is listed twice"[:300],
    ),
}


@pytest.mark.parametrize("shape", PROBLEMS)
def test_a_malformed_row_says_which_row_and_what_is_wrong(shape: str) -> None:
    bad, problem = PROBLEMS[shape]
    with pytest.raises(Malformed) as caught:
        entry_parse(bad)
    assert (caught.value.row_id, caught.value.problem) == (1, problem)
    assert str(caught.value) == f"journal row 1: {problem}"
    book = journal_reduce([row("set", until_ms=5000), {**bad, "id": 2}])
    assert book.unreadable == Unreadable(row_id=2, problem=problem)
    assert book.unreadable.describe() == f"row 2: {problem}"
    assert book.unknown("ada", "m1")


def test_a_read_failure_without_a_row_is_described_by_its_problem_alone() -> None:
    assert (
        Unreadable(row_id=None, problem="the journal could not be read").describe()
        == "the journal could not be read"
    )
    assert Unreadable(row_id=0, problem="bad").describe() == "row 0: bad"


@pytest.mark.parametrize("value", ["ada", "a" * 100, "Ada Lovelace", "mödel-ünïcode", " ada "])
def test_a_usable_name_has_no_problem(value: str) -> None:
    assert name_problem(value, limit=100) is None


@pytest.mark.parametrize("value", ["a\ud800da", "\udfff", "ada\udc80"])
def test_a_name_with_a_lone_surrogate_is_not_valid_unicode_text(value: str) -> None:
    # A JSON body may decode to one ("\\ud800"); PostgreSQL would refuse to store it.
    problem = "must not contain lone surrogates (not valid Unicode text)"
    assert name_problem(value, limit=100) == problem
    assert name_problem(value, limit=100, every_model=True) == problem


def test_every_model_is_a_name_only_where_it_means_every_model() -> None:
    assert name_problem("*", limit=100) == '"*" is not a name here'
    assert name_problem("*", limit=100, every_model=True) is None
    assert name_problem("**", limit=100) is None


# --- well-formed rows, read whole -------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "entry"),
    [
        pytest.param(
            {"id": 7, "until_ms": 5000, "reason": "429 from the provider", "at_ms": NOW + 5},
            Entry(
                kind="set",
                agent="ada",
                model="m1",
                until=5000,
                reason="429 from the provider",
                at=NOW + 5,
                id=7,
            ),
            id="set",
        ),
        pytest.param(
            {"id": 8, "until_ms": None, "reason": "", "at_ms": 0},
            Entry(kind="set", agent="ada", model="m1", until=None, reason="", at=0.0, id=8),
            id="set-indefinite-at-zero",
        ),
        pytest.param(
            {"until_ms": 0, "at_ms": MAX_INSTANT_MS},
            Entry(
                kind="set",
                agent="ada",
                model="m1",
                until=0,
                reason="r",
                at=float(MAX_INSTANT_MS),
                id=1,
            ),
            id="set-edges-of-the-range",
        ),
        pytest.param(
            {"until_ms": MAX_INSTANT_MS},
            Entry(
                kind="set", agent="ada", model="m1", until=MAX_INSTANT_MS, reason="r", at=NOW, id=1
            ),
            id="set-until-the-largest-instant",
        ),
        pytest.param(
            {"until_ms": 5000.0, "at_ms": 12},
            Entry(kind="set", agent="ada", model="m1", until=5000, reason="r", at=12.0, id=1),
            id="set-whole-float-until-and-int-at",
        ),
    ],
)
def test_a_set_row_reads_as_exactly_its_fields(fields: dict[str, Any], entry: Entry) -> None:
    parsed = entry_parse(row("set", **fields))
    assert parsed == entry
    assert type(parsed.until) is type(entry.until) and type(parsed.at) is float


def test_a_release_row_reads_as_its_agent_model_and_id() -> None:
    assert entry_parse(row("release", id=9, model="m2")) == Entry(
        kind="release", agent="ada", model="m2", id=9
    )
    assert entry_parse(row("release", id=10, model="*")) == Entry(
        kind="release", agent="ada", model="*", id=10
    )


def test_a_checkpoint_row_reads_as_its_snapshot_and_round_trips_with_wait_snapshot() -> None:
    waits = (
        Wait(agent="ada", model="m1", until=9000, reason="429", set_at=NOW),
        Wait(agent="ada", model="m2", until=None, reason="retry-after: never", set_at=0.0),
        Wait(
            agent="bob", model="m1", until=MAX_INSTANT_MS, reason="", set_at=float(MAX_INSTANT_MS)
        ),
    )
    data = {"waits": [wait_snapshot(w) for w in waits]}
    assert data["waits"][0] == {
        "agent": "ada",
        "model": "m1",
        "until": 9000,
        "reason": "429",
        "set_at": NOW,
    }
    parsed = entry_parse(row("checkpoint", id=11, agent="ignored", model="ignored", data=data))
    assert parsed == Entry(kind="checkpoint", agent="", model="", id=11, waits=waits)


# --- the deadline rule, whole ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("stated", "deadline"),
    [
        pytest.param("5000", Deadline(until=None, over=False), id="a-string"),
        pytest.param(True, Deadline(until=None, over=False), id="a-boolean"),
        pytest.param(10**400, Deadline(until=None, over=False), id="an-int-too-large-for-a-float"),
        pytest.param(
            -(10**400), Deadline(until=int(NOW), over=True), id="an-int-too-small-for-a-float"
        ),
        pytest.param(math.nan, Deadline(until=None, over=False), id="nan"),
        pytest.param(math.inf, Deadline(until=None, over=False), id="inf"),
        pytest.param(0, Deadline(until=int(NOW), over=True), id="zero"),
        pytest.param(-5, Deadline(until=int(NOW), over=True), id="negative"),
        pytest.param(
            MAX_INSTANT_MS, Deadline(until=None, over=False), id="past-the-largest-instant"
        ),
        pytest.param(sys.float_info.max, Deadline(until=None, over=False), id="the-largest-float"),
        pytest.param(1000, Deadline(until=int(NOW) + 1000, over=False), id="a-second"),
    ],
)
def test_the_deadline_rule_gives_exactly_this_deadline(stated: Any, deadline: Deadline) -> None:
    assert wait_deadline(now_ms=NOW, retry_after_ms=stated) == deadline


def test_a_wait_that_ends_exactly_at_the_largest_instant_is_an_instant() -> None:
    assert wait_deadline(now_ms=MAX_INSTANT_MS - 1000, retry_after_ms=1000) == Deadline(
        until=MAX_INSTANT_MS, over=False
    )
    assert wait_deadline(now_ms=MAX_INSTANT_MS - 1000, retry_after_ms=1000.5) == Deadline(
        until=None, over=False
    )


# --- the book, beyond lookups -----------------------------------------------------------------


def checkpoint(*waits: Wait) -> Entry:
    return Entry(kind="checkpoint", agent="", model="", waits=waits)


def test_a_set_records_its_wait_whole() -> None:
    book = WaitBook()
    assert book.apply(set_("ada", "m1", 5000, at=NOW + 3, reason="429")) == Applied(changed=True)
    assert book.lookup("ada", "m1") == Wait(
        agent="ada", model="m1", until=5000, reason="429", set_at=NOW + 3, source="recorded"
    )
    assert book.apply(set_("ada", "m1", 4000)) == Applied(changed=False)
    book.apply(set_("ada", "m2", 5000), source="pending")
    assert book.lookup("ada", "m2").source == "pending"  # type: ignore[union-attr]


def test_releasing_what_is_not_held_lifts_nothing_and_keeps_no_empty_agent() -> None:
    book = WaitBook()
    assert book.apply(release("ada", "m1")) == Applied(lifted=())
    assert book.apply(release("ada", "*")) == Applied(lifted=())
    book.apply(set_("ada", "m1", 5000))
    book.apply(set_("bob", "m1", 5000))
    assert book.apply(release("ada", "m2")) == Applied(lifted=())
    book.apply(release("ada", "m1"))
    assert list(book.waits) == ["bob"]  # an agent whose last wait went is no longer listed
    assert book.agent_binding("ada", NOW) == []


def test_a_checkpoint_makes_unreadable_records_readable_again() -> None:
    book = journal_reduce(
        [
            row("pause", id=1),
            row("release", id=2, model="*"),
            row("release", id=3, agent="bob", model="m1"),
        ]
    )
    assert (
        not book.readable and book.known_agents == {"ada"} and book.known_pairs == {("bob", "m1")}
    )
    kept = Wait(agent="cy", model="m1", until=9000, reason="r", set_at=NOW)
    assert book.apply(checkpoint(kept)) == Applied(changed=True)
    assert book.readable and book.unreadable is None
    assert book.known_agents == set() and book.known_pairs == set()
    assert not book.unknown("ada", "m1") and not book.unknown("dee", "m1")
    assert book.waits == {"cy": {("m1", ""): kept}}


def test_pending_acts_apply_over_an_unreadable_book_keeping_what_it_knows() -> None:
    durable = journal_reduce(
        [
            row("set", id=1, model="m3", until_ms=9000),
            row("pause", id=2),
            row("release", id=3, agent="bob", model="*"),
            row("release", id=4, agent="cy", model="m1"),
        ]
    )
    binding = pending_overlay(durable, [release("dee", "m1")])
    assert (
        binding.unreadable
        == durable.unreadable
        == Unreadable(row_id=2, problem="unknown kind 'pause'")
    )
    assert binding.known_agents == {"bob"} and binding.known_pairs == {("cy", "m1"), ("dee", "m1")}
    assert binding.lookup("ada", "m3") == durable.lookup("ada", "m3")
    assert not binding.unknown("bob", "m9") and binding.unknown("ada", "m1")
    # ... and the durable book is left as it was
    assert durable.known_agents == {"bob"} and durable.known_pairs == {("cy", "m1")}
    binding.apply(release("ada", "m3"))
    assert durable.lookup("ada", "m3") is not None


def test_binding_lists_every_wait_that_binds_now_and_agent_binding_one_agents() -> None:
    book = WaitBook()
    for agent, model, until in [
        ("ada", "m1", 5000),
        ("ada", "m2", None),
        ("ada", "m3", 4000),
        ("bob", "m1", 6000),
    ]:
        book.apply(set_(agent, model, until))

    def pairs(waits: Any) -> list[tuple[str, str]]:
        return sorted((w.agent, w.model) for w in waits)

    assert pairs(book.binding(3999)) == [("ada", "m1"), ("ada", "m2"), ("ada", "m3"), ("bob", "m1")]
    assert pairs(book.binding(4000)) == [("ada", "m1"), ("ada", "m2"), ("bob", "m1")]
    assert pairs(book.binding(6000)) == [("ada", "m2")]
    assert pairs(book.agent_binding("ada", 4999)) == [("ada", "m1"), ("ada", "m2")]
    assert pairs(book.agent_binding("ada", 5000)) == [("ada", "m2")]
    assert pairs(book.agent_binding("bob", 5999)) == [("bob", "m1")]
    assert book.agent_binding("cy", 0) == []


# --- alternates: a wait binds (agent, model, provider) (§6.11) ------------------------------


def test_a_wait_on_an_alternates_provider_binds_only_there_and_a_release_of_the_model_lifts_both() -> (
    None
):
    book = journal_reduce(
        [
            row("set", id=1, until_ms=9000),
            row("set", id=2, until_ms=8000, provider="azure"),
        ]
    )
    own, azure = book.lookup("ada", "m1"), book.lookup("ada", "m1", "azure")
    assert own is not None and own.until == 9000  # the agent's own provider ("")
    assert azure is not None and azure.until == 8000
    assert book.lookup("ada", "m1", "other") is None
    only_azure = book.copy()
    lifted = only_azure.apply(Entry(kind="release", agent="ada", model="m1", provider="azure"))
    assert [w.provider for w in lifted.lifted] == ["azure"]
    assert only_azure.lookup("ada", "m1") == own
    both = book.apply(Entry(kind="release", agent="ada", model="m1"))
    assert sorted(w.provider for w in both.lifted) == ["", "azure"]
    assert book.waits == {}


def test_a_rows_provider_is_checked_like_a_name_and_kept_through_a_checkpoint() -> None:
    with pytest.raises(Malformed, match="provider must not contain control characters"):
        entry_parse(row("set", until_ms=9000, provider="az\x1bure"))
    assert entry_parse(row("set", until_ms=9000)).provider == ""
    wait = Wait(agent="ada", model="m1", until=9000, reason="r", set_at=NOW, provider="azure")
    snapshot = wait_snapshot(wait)
    assert snapshot["provider"] == "azure"
    assert "provider" not in wait_snapshot(Wait("ada", "m1", 9000, "r", NOW))
    parsed = entry_parse(row("checkpoint", data={"waits": [snapshot]}))
    assert parsed.waits == (wait,)
