"""The routing core (architecture.md §6.11) at its edges: plain values, no database."""

from __future__ import annotations

from inference.routes import RouteKind
from turns.routing import Choice, Failure, Seen, down_until, overflow_need, route_choose

NOW = 1_000_000.0
AFTER = 30_000


def choose(*seen: Seen) -> tuple[int, RouteKind, str, bool] | None:
    """The choice as its row shows it: index, kind, the words of ``route``, fresh."""
    choice = route_choose(list(seen), now_ms=NOW, fallback_after_ms=AFTER)
    return None if choice is None else (choice.index, choice.kind, choice.reason, choice.fresh)


FALLBACK, PRIMARY = RouteKind.FALLBACK, RouteKind.PRIMARY


def test_a_primary_held_longer_than_the_threshold_goes_to_the_first_free_alternate() -> None:
    held_long = Seen(held=True, hold_until=int(NOW + AFTER + 1))
    assert choose(held_long, Seen(held=True, hold_until=None), Seen()) == (
        2,
        FALLBACK,
        "fallback: primary held until 1970-01-01T00:17:10+00:00",
        True,
    )
    # Exactly the threshold left: waited out on the primary.
    assert choose(Seen(held=True, hold_until=int(NOW + AFTER)), Seen()) is None
    # Held until released: always an alternate when one is free, else the hold.
    assert choose(Seen(held=True), Seen()) == (
        1,
        FALLBACK,
        "fallback: primary held until released",
        True,
    )
    assert choose(Seen(held=True), Seen(held=True)) is None


def test_a_primary_down_goes_to_an_alternate_until_its_interval_passes() -> None:
    down = Seen(down_until=NOW + 1, down_why="a auth failure")
    assert choose(down, Seen()) == (1, FALLBACK, "fallback: primary down (a auth failure)", True)
    assert choose(Seen(down_until=NOW), Seen()) == (0, PRIMARY, "primary", True)
    # Nothing else may serve: the primary anyway, and the retry policy paces it.
    assert choose(down, Seen(down_until=NOW + 5)) == (
        0,
        PRIMARY,
        "primary (every alternate is held or down)",
        False,
    )


def test_what_makes_a_target_down() -> None:
    def down(*latest: Failure) -> float | None:
        return down_until(list(latest), retry_after_ms=30_000)[0]

    server = Failure("server", ended_ms=NOW)
    assert down(server) is None  # one 5xx may be a blip
    assert down(server, Failure("server", ended_ms=NOW - 30_000)) == NOW + 30_000
    assert down(server, Failure(None)) is None
    assert down(Failure("server", after_content=True, ended_ms=NOW)) == NOW + 30_000
    assert down(Failure("auth", ended_ms=NOW)) == NOW + 30_000
    assert down(Failure("timeout", ended_ms=NOW)) == NOW + 30_000
    assert down(Failure("rate_limit", ended_ms=NOW)) == NOW + 30_000
    # A stated wait is the journal's to hold, not a reason to call the target down.
    assert down(Failure("rate_limit", stated_wait=True, ended_ms=NOW)) is None
    assert down(Failure("invalid_request", ended_ms=NOW), server) is None
    assert down(Failure(None), server) is None
    assert down() is None


def test_two_failures_in_a_row_count_only_within_the_retry_interval_of_each_other() -> None:
    def down(earlier_ms: float) -> float | None:
        latest = [Failure("server", ended_ms=NOW), Failure("overloaded", ended_ms=earlier_ms)]
        return down_until(latest, retry_after_ms=30_000)[0]

    assert down(NOW - 30_000) == NOW + 30_000  # at the interval: still in a row
    assert down(NOW - 30_001) is None  # a 503 from longer ago says nothing of now
    assert down(NOW - 17 * 60_000) is None
    # A return to the primary that fails: down again at once, whenever the failure before it.
    returned = Failure("server", ended_ms=NOW, returning=True)
    assert down_until([returned], retry_after_ms=30_000) == (
        NOW + 30_000,
        "a server failure on its return",
    )


def test_a_refused_request_counts_as_one_more_than_the_window_the_refusal_stated() -> None:
    assert overflow_need(8_192, 200_000) == 8_193  # the stated window, not the configured one
    assert overflow_need(None, 8_000) == 8_001  # none stated: the refused target's known one
    assert overflow_need(None, None) is None


def test_a_choice_in_words_is_its_kind_and_why() -> None:
    assert Choice(0, RouteKind.RETURNING).reason == "return to primary"
    assert Choice(0, RouteKind.POOL).reason == "pool"
    assert Choice(2, RouteKind.HEDGE, "no content after 20 ms").reason == (
        "hedge: no content after 20 ms"
    )
    assert RouteKind.HEDGE.alternate and RouteKind.FALLBACK.alternate
    assert not any(k.alternate for k in (PRIMARY, RouteKind.POOL, RouteKind.RETURNING))


def test_a_smooth_rotation_gives_each_its_share_spread_out() -> None:
    from turns.routing import smooth_pick

    picks, credit = [], [0.0, 0.0]
    for _ in range(8):
        pick, credit = smooth_pick([1.0, 3.0], credit)
        picks.append(pick)
    assert picks == [1, 0, 1, 1, 1, 0, 1, 1]  # 3 of every 4 to the heavy one, never 4 in a row
    assert credit == [0.0, 0.0]  # a whole cycle leaves no credit behind
    # Scores that change between picks (what a member has left) still share by the scores.
    picks, credit = [], [0.0, 0.0, 0.0]
    for _ in range(600):
        pick, credit = smooth_pick([1.0, 2.0, 3.0], credit)
        picks.append(pick)
    assert [picks.count(i) for i in range(3)] == [100, 200, 300]
    assert smooth_pick([2.0, 2.0], [0.0, 0.0])[0] == 0  # a tie: the first


def test_why_a_target_is_down_is_said_for_each_rule() -> None:
    """The reason routing gives (the call row's route and the API's ``down_why``), rule by rule,
    and none at all when the target is not down."""

    def why(*latest: Failure) -> str:
        return down_until(list(latest), retry_after_ms=30_000)[1]

    assert why(Failure("rate_limit", ended_ms=NOW)) == "a 429 without a stated wait"
    assert why(Failure("budget_edge", ended_ms=NOW)) == (
        "its worst case is over what the budget has left"
    )
    assert why(Failure("auth", ended_ms=NOW)) == "a auth failure"
    assert why(Failure("quota", ended_ms=NOW)) == "a quota failure"
    assert why(Failure("network", after_content=True, ended_ms=NOW)) == (
        "its answer was cut after content"
    )
    assert why(Failure("overloaded", returning=True, ended_ms=NOW)) == (
        "a overloaded failure on its return"
    )
    assert why(Failure("server", ended_ms=NOW), Failure("network", ended_ms=NOW - 1)) == (
        "two server failures in a row"
    )
    for not_down in ((), (Failure(None),), (Failure("server", ended_ms=NOW),)):
        assert down_until(list(not_down), retry_after_ms=30_000) == (None, "")
    assert down_until([Failure("budget_edge", ended_ms=NOW)], retry_after_ms=5) == (
        NOW + 5,
        "its worst case is over what the budget has left",
    )


def test_the_stored_alternates_are_the_objects_of_a_list() -> None:
    from turns.routing import alternates

    assert alternates([{"model": "a"}, "junk", 3, {"model": "b"}]) == [
        {"model": "a"},
        {"model": "b"},
    ]
    assert alternates({"model": "a"}) == [] and alternates(None) == [] and alternates("ab") == []


def test_a_rotation_refuses_credit_that_does_not_match_its_members() -> None:
    import pytest

    from turns.routing import smooth_pick

    with pytest.raises(ValueError):
        smooth_pick([1.0, 2.0], [0.0])
