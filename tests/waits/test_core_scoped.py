"""The pure core's scoped waits, acceleration cooldowns and operators' holds (architecture.md
§6.12): a provider's limit on a model or the account, a release of it, an operator's hold that
only its own lift ends, and their rows read back and written into a checkpoint."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from waits.core import (
    EVERY_AGENT,
    EVERY_MODEL,
    Applied,
    Entry,
    Malformed,
    Wait,
    WaitBook,
    entry_parse,
    journal_reduce,
    pending_overlay,
    wait_snapshot,
)

NOW = 1_000_000.0
P = "openai"


def scoped(
    model: str,
    until: int | None,
    *,
    provider: str = P,
    own_until: int | None = None,
    lengthened_by: str = "",
) -> Entry:
    return Entry(
        kind="set",
        agent=EVERY_AGENT,
        model=model,
        until=until,
        reason="429",
        at=NOW,
        provider=provider,
        own_until=own_until,
        lengthened_by=lengthened_by,
    )


def own(agent: str, model: str, until: int | None) -> Entry:
    return Entry(kind="set", agent=agent, model=model, until=until, reason="429", at=NOW)


def release(model: str = EVERY_MODEL, *, agent: str = EVERY_AGENT, provider: str = P) -> Entry:
    return Entry(kind="release", agent=agent, model=model, provider=provider)


def hold(
    ref: str,
    *,
    agent: str = EVERY_AGENT,
    model: str = EVERY_MODEL,
    provider: str = P,
    until: int | None = None,
) -> Entry:
    return Entry(
        kind="hold",
        agent=agent,
        model=model,
        until=until,
        reason="maintenance",
        at=NOW,
        provider=provider,
        ref=ref,
    )


def lift(ref: str) -> Entry:
    return Entry(kind="lift", agent="", model="", ref=ref)


def bound(
    book: WaitBook, agent: str = "ada", model: str = "m1", provider: str = P, now: float = NOW
) -> Wait | None:
    """What binds ``agent``'s call to ``model`` on its own provider, named ``provider``."""
    return book.binding_on(
        agent=agent, model=model, provider="", provider_name=provider, now_ms=now
    )


def book_of(*entries: Entry) -> WaitBook:
    book = WaitBook()
    for entry in entries:
        book.apply(entry)
    return book


# --- a scoped wait and its release ------------------------------------------------------------


def test_a_scoped_set_records_its_provider_and_cooldown_whole() -> None:
    book = book_of(scoped(EVERY_MODEL, 9_000_000, own_until=1_065_000, lengthened_by="gpt-x"))
    assert book.lookup(EVERY_AGENT, EVERY_MODEL, P) == Wait(
        agent=EVERY_AGENT,
        model=EVERY_MODEL,
        until=9_000_000,
        reason="429",
        set_at=NOW,
        source="recorded",
        provider=P,
        own_until=1_065_000,
        lengthened_by="gpt-x",
        ref="",
    )


def test_a_release_of_a_providers_model_lifts_that_models_wait_on_that_provider_only() -> None:
    book = book_of(
        own("ada", "m1", 2_000_000),
        scoped("m1", 3_000_000),
        scoped("m2", 3_000_000),
        scoped("m1", 3_000_000, provider="azure"),
    )
    lifted = book.apply(release("m1")).lifted
    assert [(w.agent, w.model, w.provider) for w in lifted] == [(EVERY_AGENT, "m1", P)]
    assert book.lookup(EVERY_AGENT, "m1", P) is None
    assert book.lookup(EVERY_AGENT, "m2", P) is not None
    assert book.lookup(EVERY_AGENT, "m1", "azure") is not None
    # Releasing a provider's limit leaves an agent's own wait.
    assert book.lookup("ada", "m1") is not None


def test_a_release_of_every_model_lifts_the_providers_scoped_waits_and_none_elsewhere() -> None:
    book = book_of(
        scoped("m1", 3_000_000),
        scoped(EVERY_MODEL, 4_000_000),
        scoped("m1", 3_000_000, provider="q"),
    )
    lifted = book.apply(release(EVERY_MODEL)).lifted
    assert sorted(w.model for w in lifted) == [EVERY_MODEL, "m1"]
    assert book.scoped_known and list(book.waits[EVERY_AGENT]) == [("m1", "q")]
    # The last scoped wait gone, the book keeps none: an agent's call reads no provider.
    assert book.apply(release(EVERY_MODEL, provider="q")).lifted
    assert EVERY_AGENT not in book.waits and not book.scoped_known


def test_releasing_an_agents_own_waits_leaves_the_scoped_ones() -> None:
    book = book_of(own("ada", "m1", 2_000_000), scoped("m1", 5_000_000))
    book.apply(release(EVERY_MODEL, agent="ada", provider=""))
    assert book.lookup("ada", "m1") is None
    found = bound(book)
    assert found is not None and found.scope == "model" and found.until == 5_000_000


# --- the acceleration cooldown (the seeds' rules) ---------------------------------------------

COOLDOWN = scoped(EVERY_MODEL, 8_200_000, own_until=1_065_000, lengthened_by="gpt-x")


def test_a_release_covering_the_lengthening_model_shortens_the_cooldown_and_lifts_the_rest() -> (
    None
):
    book = book_of(COOLDOWN, scoped("m1", 1_030_000))
    was, m1 = book.lookup(EVERY_AGENT, EVERY_MODEL, P), book.lookup(EVERY_AGENT, "m1", P)
    assert was is not None and m1 is not None
    applied = book.apply(release(EVERY_MODEL))
    assert applied == Applied(lifted=(was, m1))
    # Back to the service's own pacing, lengthened by no model now, and never released.
    assert book.lookup(EVERY_AGENT, EVERY_MODEL, P) == replace(
        was, until=1_065_000, lengthened_by=""
    )
    assert book.lookup(EVERY_AGENT, "m1", P) is None


def test_a_cooldown_a_stated_wait_held_until_released_goes_back_to_the_own_pacing() -> None:
    book = book_of(scoped(EVERY_MODEL, None, own_until=1_065_000, lengthened_by="gpt-x"))
    book.apply(release("gpt-x"))
    after = book.lookup(EVERY_AGENT, EVERY_MODEL, P)
    assert after is not None and (after.until, after.lengthened_by) == (1_065_000, "")


def test_a_release_never_lengthens_a_cooldown() -> None:
    book = book_of(scoped(EVERY_MODEL, 1_030_000, own_until=1_065_000, lengthened_by="gpt-x"))
    book.apply(release("gpt-x"))
    after = book.lookup(EVERY_AGENT, EVERY_MODEL, P)
    assert after is not None and after.until == 1_030_000


@pytest.mark.parametrize(
    "cooldown",
    [
        # Lengthened by another model's wait than the one released.
        COOLDOWN,
        # Lengthened by no stated wait: the own pacing alone, which no release ends.
        scoped(EVERY_MODEL, 1_065_000, own_until=1_065_000),
    ],
    ids=["lengthened-by-another-model", "own-pacing-alone"],
)
def test_a_release_the_cooldown_does_not_answer_to_leaves_it_as_it_was(cooldown: Entry) -> None:
    book = book_of(cooldown)
    was = book.lookup(EVERY_AGENT, EVERY_MODEL, P)
    released = "gpt-y" if cooldown.lengthened_by else EVERY_MODEL
    assert book.apply(release(released)) == Applied(lifted=())
    assert book.lookup(EVERY_AGENT, EVERY_MODEL, P) == was


# --- what binds a call ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("agents", "models", "account", "scope"),
    [
        (5_000, 1_000, 3_000, "agent"),
        (1_000, 5_000, 3_000, "model"),
        (1_000, 3_000, 5_000, "provider"),
        (1_000, None, 5_000, "model"),  # until released outlasts any instant
    ],
)
def test_a_call_is_bound_by_the_longest_of_its_agents_the_models_and_the_accounts_wait(
    agents: int, models: int | None, account: int, scope: str
) -> None:
    book = book_of(
        own("ada", "m1", int(NOW) + agents),
        scoped("m1", None if models is None else int(NOW) + models),
        scoped(EVERY_MODEL, int(NOW) + account),
    )
    found = bound(book)
    assert found is not None and found.scope == scope


def test_a_scoped_wait_binds_only_its_providers_model_and_only_until_its_end() -> None:
    book = book_of(scoped("m1", 1_005_000))
    assert bound(book) == book.lookup(EVERY_AGENT, "m1", P)
    assert bound(book, agent="bob") is not None  # every agent on the provider
    assert bound(book, model="m2") is None
    assert bound(book, provider="azure") is None
    assert bound(book, now=1_004_999) is not None
    assert bound(book, now=1_005_000) is None


def test_an_agents_call_through_an_alternate_is_bound_by_its_wait_there_not_by_its_own() -> None:
    book = book_of(Entry("set", "ada", "m1", 1_005_000, "429", NOW, provider="azure"))
    through_azure = book.binding_on(
        agent="ada", model="m1", provider="azure", provider_name="azure", now_ms=NOW
    )
    assert through_azure == book.lookup("ada", "m1", "azure")
    assert bound(book) is None  # its own provider's call


def test_nothing_binds_when_every_wait_has_ended() -> None:
    book = book_of(own("ada", "m1", 999_000), scoped("m1", 999_500), scoped(EVERY_MODEL, 1_000_000))
    assert bound(book) is None
    assert list(book.binding(NOW)) == [] and book.scoped_binding(NOW) == []


# --- operators' holds -------------------------------------------------------------------------


def test_a_hold_is_recorded_by_its_ref_and_only_its_lift_ends_it() -> None:
    book = WaitBook()
    assert book.apply(hold("h1")) == Applied(changed=True)
    held = Wait(
        agent=EVERY_AGENT,
        model=EVERY_MODEL,
        until=None,
        reason="maintenance",
        set_at=NOW,
        provider=P,
        ref="h1",
    )
    assert book.holds == {"h1": held}
    for entry in (release(EVERY_MODEL), release("m1"), release(EVERY_MODEL, agent="ada")):
        assert book.apply(entry) == Applied(lifted=())
    assert bound(book) == held
    assert book.apply(lift("h2")) == Applied(lifted=())
    assert book.apply(lift("h1")) == Applied(lifted=(held,))
    assert book.holds == {} and bound(book) is None


def test_a_pending_hold_is_marked_pending() -> None:
    book = WaitBook()
    book.apply(hold("h1"), source="pending")
    assert book.holds["h1"].source == "pending"


@pytest.mark.parametrize(
    ("held", "agent", "model", "provider", "binds"),
    [
        (hold("h"), "ada", "m1", P, True),
        (hold("h"), "ada", "m1", "azure", False),
        (hold("h", model="m1"), "bob", "m1", P, True),
        (hold("h", model="m1"), "ada", "m2", P, False),
        (hold("h", agent="ada"), "ada", "m9", P, True),
        (hold("h", agent="ada"), "bob", "m1", P, False),
        (hold("h", agent="ada", model="m1"), "ada", "m1", P, True),
        (hold("h", agent="ada", model="m1"), "ada", "m2", P, False),
        (hold("h", agent="ada", model="m1"), "bob", "m1", P, False),
    ],
    ids=[
        "account",
        "account-elsewhere",
        "model-any-agent",
        "model-another-model",
        "agent-any-model",
        "agent-another-agent",
        "agent-and-model",
        "agent-and-model-another-model",
        "agent-and-model-another-agent",
    ],
)
def test_a_hold_binds_exactly_the_calls_it_covers(
    held: Entry, agent: str, model: str, provider: str, binds: bool
) -> None:
    book = book_of(held)
    assert (bound(book, agent=agent, model=model, provider=provider) is not None) is binds


def test_a_hold_that_has_ended_binds_nothing_and_one_that_outlasts_a_wait_binds() -> None:
    book = book_of(
        scoped("m1", 1_005_000), hold("short", until=1_001_000), hold("over", until=999_000)
    )
    found = bound(book)
    assert found is not None and found.ref == "" and found.until == 1_005_000
    book.apply(hold("long", until=1_009_000))
    found = bound(book)
    assert found is not None and found.ref == "long"


def test_what_is_scoped_and_what_of_it_binds_now() -> None:
    assert not WaitBook().scoped_known and WaitBook().scoped_binding(NOW) == []
    only_held = book_of(own("ada", "m1", 2_000_000), hold("h1"))
    assert only_held.scoped_binding(NOW) == [only_held.holds["h1"]]
    assert not book_of(own("ada", "m1", 2_000_000)).scoped_known
    assert book_of(scoped("m1", 2_000_000)).scoped_known
    assert book_of(hold("h1")).scoped_known
    book = book_of(
        own("ada", "m1", 2_000_000),
        scoped("m1", 2_000_000),
        scoped("m2", 1_000_000),  # ends now
        hold("h1"),
        hold("h2", until=1_000_000),  # ends now
    )
    assert [(w.model, w.ref) for w in book.scoped_binding(NOW)] == [("m1", ""), (EVERY_MODEL, "h1")]
    assert [(w.model, w.ref) for w in book.scoped_binding(NOW - 1)] == [
        ("m1", ""),
        ("m2", ""),
        (EVERY_MODEL, "h1"),
        (EVERY_MODEL, "h2"),
    ]


def test_a_checkpoint_replaces_the_holds_with_those_it_carries() -> None:
    book = book_of(hold("old"))
    kept = Wait(EVERY_AGENT, EVERY_MODEL, None, "maintenance", NOW, provider=P, ref="kept")
    book.apply(Entry(kind="checkpoint", agent="", model="", holds=(kept,)))
    assert book.holds == {"kept": kept}


def test_pending_acts_on_holds_bind_over_the_durable_book_without_changing_it() -> None:
    durable = book_of(hold("h1"))
    assert bound(pending_overlay(durable, [release("m9")])) == durable.holds["h1"]
    lifted = pending_overlay(durable, [lift("h1")])
    assert bound(lifted) is None and "h1" in durable.holds
    added = pending_overlay(durable, [hold("h2", model="m2")])
    assert set(added.holds) == {"h1", "h2"} and set(durable.holds) == {"h1"}


def test_after_an_unreadable_row_a_release_on_one_provider_makes_nothing_certain() -> None:
    book = journal_reduce([{"id": 1, "kind": "pause"}])
    book.apply(release("m1", agent="ada", provider="azure"))
    assert book.unknown("ada", "m1")
    book.apply(release("m1", agent="ada", provider=""))
    assert not book.unknown("ada", "m1")


# --- the rows read back -----------------------------------------------------------------------


def row(kind: str, **fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "id": 1,
        "kind": kind,
        "agent": "ada",
        "model": "m1",
        "until_ms": 9000,
        "reason": "r",
        "at_ms": NOW,
        "data": {},
    }
    return {**base, **fields}


@pytest.mark.parametrize(
    ("fields", "entry"),
    [
        pytest.param(
            row("set", agent="*", provider=P),
            Entry("set", "*", "m1", until=9000, reason="r", at=NOW, id=1, provider=P),
            id="scoped-to-a-model",
        ),
        pytest.param(
            row("set", agent="*", model="*", provider=P),
            Entry("set", "*", "*", until=9000, reason="r", at=NOW, id=1, provider=P),
            id="scoped-to-the-account",
        ),
        pytest.param(
            row("set", provider="azure"),
            Entry("set", "ada", "m1", until=9000, reason="r", at=NOW, id=1, provider="azure"),
            id="an-alternates",
        ),
        pytest.param(
            row(
                "set",
                agent="*",
                model="*",
                provider=P,
                data={"own_until": 5000, "lengthened_by": "gpt-x"},
            ),
            Entry(
                "set",
                "*",
                "*",
                until=9000,
                reason="r",
                at=NOW,
                id=1,
                provider=P,
                own_until=5000,
                lengthened_by="gpt-x",
            ),
            id="a-cooldown",
        ),
        pytest.param(
            row("set", agent="*", model="*", provider=P, data={"own_until": 5000}),
            Entry(
                "set", "*", "*", until=9000, reason="r", at=NOW, id=1, provider=P, own_until=5000
            ),
            id="a-cooldown-lengthened-by-no-model",
        ),
        pytest.param(
            row("release", agent="*", model="*", provider=P),
            Entry("release", "*", "*", id=1, provider=P),
            id="a-release-of-the-account",
        ),
        pytest.param(
            row("hold", model="*", provider=P, until_ms=None, data={"ref": "h1"}),
            Entry("hold", "ada", "*", until=None, reason="r", at=NOW, id=1, provider=P, ref="h1"),
            id="a-hold-of-one-agent",
        ),
        pytest.param(
            row("hold", agent="*", model="*", provider=P, data={"ref": "r" * 64}),
            Entry("hold", "*", "*", until=9000, reason="r", at=NOW, id=1, provider=P, ref="r" * 64),
            id="a-hold-with-the-longest-ref",
        ),
        pytest.param(
            row("lift", data={"ref": "h1"}),
            Entry("lift", "", "", id=1, ref="h1"),
            id="a-lift",
        ),
        pytest.param(
            row("set", data=None),
            Entry("set", "ada", "m1", until=9000, reason="r", at=NOW, id=1),
            id="a-set-without-data",
        ),
    ],
)
def test_a_scoped_cooldown_or_hold_row_reads_as_exactly_its_fields(
    fields: dict[str, Any], entry: Entry
) -> None:
    assert entry_parse(fields) == entry


def test_what_a_row_keeps_in_data_reads_back_as_the_same_entry() -> None:
    cooldown = Entry("set", "*", "*", 9000, "r", NOW, 1, provider=P, own_until=5, lengthened_by="m")
    held = Entry("hold", "*", "*", None, "r", NOW, 1, provider=P, ref="h1")
    assert cooldown.data() == {"own_until": 5, "lengthened_by": "m"}
    assert held.data() == {"ref": "h1"}
    assert Entry("set", "ada", "m1", 9000, "r", NOW, 1).data() == {}
    for entry in (cooldown, held):
        fields = row(
            entry.kind,
            agent=entry.agent,
            model=entry.model,
            until_ms=entry.until,
            provider=entry.provider,
            data=entry.data(),
        )
        assert entry_parse(fields) == entry


NO_REF = "an operator hold without its ref"
GOOD_WAIT = {"agent": "ada", "model": "m1", "until": 9000, "reason": "r", "set_at": NOW}
GOOD_HOLD = {**GOOD_WAIT, "agent": "*", "model": "*", "provider": P, "ref": "h1"}

PROBLEMS: dict[str, tuple[dict[str, Any], str]] = {
    "scoped set without a provider": (
        row("set", agent="*"),
        'agent "*" (every agent) without a provider',
    ),
    "provider with a control character": (
        row("set", provider="az\x1bure"),
        "provider must not contain control characters",
    ),
    "provider one character too long": (
        row("set", provider="p" * 101),
        "provider must be at most 100 characters",
    ),
    "provider every-model": (row("set", provider="*"), 'provider "*" is not a name here'),
    "lengthened_by every-model": (
        row("set", data={"lengthened_by": "*"}),
        'lengthened_by "*" is not a name here',
    ),
    "model every-model in an agent's set": (
        row("set", model="*", provider=P),
        'model "*" is not a name here',
    ),
    "hold without a ref": (row("hold", model="*"), NO_REF),
    "hold with an empty ref": (row("hold", data={"ref": ""}), NO_REF),
    "hold with a ref not a string": (row("hold", data={"ref": 7}), NO_REF),
    "hold with a ref one character too long": (row("hold", data={"ref": "r" * 65}), NO_REF),
    "lift without a ref": (row("lift"), NO_REF),
    "own_until negative": (
        row("set", data={"own_until": -1}),
        "own_until is not null or an instant in range: -1",
    ),
    "lengthened_by with a control character": (
        row("set", data={"lengthened_by": "gpt\x00"}),
        "lengthened_by must not contain control characters",
    ),
    "checkpoint with data null": (
        row("checkpoint", data=None),
        "a checkpoint without a snapshot (data.waits is not a list)",
    ),
    "checkpoint holds not a list": (
        row("checkpoint", data={"waits": [], "holds": {"h1": GOOD_HOLD}}),
        "a checkpoint without a snapshot (data.holds is not a list)",
    ),
    "checkpoint scoped wait without a provider": (
        row("checkpoint", data={"waits": [{**GOOD_WAIT, "agent": "*"}]}),
        'snapshot wait 0: agent "*" (every agent) without a provider',
    ),
    "checkpoint wait with a bad provider": (
        row("checkpoint", data={"waits": [{**GOOD_WAIT, "provider": "az\x1bure"}]}),
        "snapshot wait 0: provider must not contain control characters",
    ),
    "checkpoint wait with a bad own_until": (
        row("checkpoint", data={"waits": [{**GOOD_WAIT, "own_until": "soon"}]}),
        "snapshot wait 0: own_until is not null or an instant in range: 'soon'",
    ),
    "checkpoint wait with a bad lengthened_by": (
        row("checkpoint", data={"waits": [{**GOOD_WAIT, "lengthened_by": "m\x00"}]}),
        "snapshot wait 0: lengthened_by must not contain control characters",
    ),
    "checkpoint hold without a ref": (
        row(
            "checkpoint",
            data={"waits": [], "holds": [{k: v for k, v in GOOD_HOLD.items() if k != "ref"}]},
        ),
        f"snapshot hold 0: {NO_REF}",
    ),
    "checkpoint hold without a provider": (
        row("checkpoint", data={"waits": [], "holds": [{**GOOD_HOLD, "provider": ""}]}),
        'snapshot hold 0: agent "*" (every agent) without a provider',
    ),
    "checkpoint with one hold twice over another scope": (
        row(
            "checkpoint",
            data={"waits": [], "holds": [GOOD_HOLD, {**GOOD_HOLD, "agent": "ada", "model": "m1"}]},
        ),
        "snapshot hold 1: ('ada', 'm1') is listed twice",
    ),
    "checkpoint with one hold twice": (
        row("checkpoint", data={"waits": [], "holds": [GOOD_HOLD, {**GOOD_HOLD, "until": None}]}),
        "snapshot hold 1: ('*', '*') is listed twice",
    ),
}


@pytest.mark.parametrize("shape", PROBLEMS)
def test_a_malformed_scoped_cooldown_or_hold_row_says_what_is_wrong(shape: str) -> None:
    bad, problem = PROBLEMS[shape]
    with pytest.raises(Malformed) as caught:
        entry_parse(bad)
    assert (caught.value.row_id, caught.value.problem) == (1, problem)


# --- a checkpoint's snapshot, written and read back -------------------------------------------


def test_a_checkpoint_keeps_scoped_waits_cooldowns_alternates_and_holds_through_a_round_trip() -> (
    None
):
    waits = (
        Wait("ada", "m1", 9000, "429", NOW),
        Wait("ada", "m1", 8000, "429", NOW, provider="azure"),  # the same pair on an alternate
        Wait(EVERY_AGENT, "m1", None, "429", NOW, provider=P),
        Wait(
            EVERY_AGENT, EVERY_MODEL, 9000, "acc", NOW, provider=P, own_until=5, lengthened_by="m"
        ),
    )
    holds = (
        Wait("ada", EVERY_MODEL, None, "maintenance", NOW, provider=P, ref="h1"),
        Wait(EVERY_AGENT, EVERY_MODEL, 9000, "outage", NOW, provider=P, ref="h2"),
    )
    assert wait_snapshot(waits[3]) == {
        "agent": EVERY_AGENT,
        "model": EVERY_MODEL,
        "until": 9000,
        "reason": "acc",
        "set_at": NOW,
        "provider": P,
        "own_until": 5,
        "lengthened_by": "m",
    }
    assert wait_snapshot(holds[0]) == {
        "agent": "ada",
        "model": EVERY_MODEL,
        "until": None,
        "reason": "maintenance",
        "set_at": NOW,
        "provider": P,
        "ref": "h1",
    }
    data = {"waits": [wait_snapshot(w) for w in waits], "holds": [wait_snapshot(h) for h in holds]}
    parsed = entry_parse(row("checkpoint", data=data))
    assert parsed == Entry(kind="checkpoint", agent="", model="", id=1, waits=waits, holds=holds)


def test_two_operators_holds_over_the_same_scope_are_both_kept() -> None:
    holds = (
        Wait(EVERY_AGENT, EVERY_MODEL, None, "maintenance", NOW, provider=P, ref="h1"),
        Wait(EVERY_AGENT, EVERY_MODEL, 9000, "known outage", NOW, provider=P, ref="h2"),
    )
    data = {"waits": [], "holds": [wait_snapshot(h) for h in holds]}
    assert entry_parse(row("checkpoint", data=data)).holds == holds


def test_each_wait_knows_whom_it_binds() -> None:
    assert Wait("ada", "m1", None, "r", NOW).scope == "agent"
    assert Wait("ada", EVERY_MODEL, None, "r", NOW, provider=P, ref="h").scope == "agent"
    assert Wait(EVERY_AGENT, "m1", None, "r", NOW, provider=P).scope == "model"
    assert Wait(EVERY_AGENT, EVERY_MODEL, None, "r", NOW, provider=P).scope == "provider"
