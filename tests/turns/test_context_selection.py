"""Which rows a trim sets aside (architecture.md §5.9): pure, over rows in order."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agentops.estimate import ratio, text_tokens
from turns.context.estimate import (
    EstimatedRow,
    LastCall,
    fixed_tokens,
    request_estimate,
    row_tokens,
    target_tokens,
)
from turns.context.selection import Row, Selection, select, units_of
from turns.context.services import Plan, too_big_error


def row(seq: int, role: str, content: Any = "x", tokens: int = 100, note: bool = False) -> Row:
    return Row(id=seq, seq=seq, role=role, content=content, tokens=tokens, note=note)


def call(seq: int, ids: list[str]) -> Row:
    return row(seq, "assistant", [{"type": "tool_call", "id": i, "name": "t"} for i in ids])


def result(seq: int, call_id: str) -> Row:
    return row(seq, "tool", [{"type": "tool_result", "tool_call_id": call_id, "content": "r"}])


def seqs(rows: list[Row]) -> list[int]:
    return [r.seq for r in rows]


HISTORY = [
    row(1, "user"),
    row(2, "assistant"),
    row(3, "user"),
    call(4, ["a", "b"]),
    result(5, "a"),
    row(6, "user"),  # a message that came while a tool call was still open
    result(7, "b"),
    row(8, "assistant"),
    row(9, "system-note", "[inference-failed] ...", note=True),
    row(10, "user"),
    row(11, "user"),
    row(12, "assistant"),
    row(13, "user"),  # the current turn
]


def test_a_tool_call_goes_with_every_result_and_messages_in_a_row_go_together() -> None:
    assert [seqs(u.rows) for u in units_of(HISTORY)] == [
        [1, 2],
        [3, 4, 5, 6, 7, 8],
        [9],
        [10, 11, 12],
        [13],
    ]


def test_notes_go_first_then_the_oldest_units_and_never_the_current_turn() -> None:
    picked = select(HISTORY, protected_from_seq=13, over_by=150)
    assert seqs(picked.rows) == [1, 2, 9] and picked.fits and picked.tokens == 300
    assert picked.kept_tokens == 100
    # Enough to need the tool run: it goes whole.
    picked = select(HISTORY, protected_from_seq=13, over_by=301)
    assert seqs(picked.rows) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    # Everything before the current turn is not enough: nothing goes.
    picked = select(HISTORY, protected_from_seq=13, over_by=1201)
    assert picked.rows == [] and not picked.fits
    # Without trigger rows the newest unit is the current turn.
    picked = select(HISTORY, protected_from_seq=None, over_by=1200)
    assert 13 not in seqs(picked.rows) and picked.fits


def test_a_unit_reaching_into_the_current_turn_is_kept_whole() -> None:
    rows = [row(1, "user"), call(2, ["a"]), row(3, "user"), result(4, "a")]
    # The current turn starts at row 3, inside the open tool call's unit: it all stays.
    picked = select(rows, protected_from_seq=3, over_by=1)
    assert picked.rows == [] and not picked.fits


def test_no_tool_pair_is_ever_split_whatever_is_asked() -> None:
    for over_by in range(0, 1300, 50):
        picked = set(seqs(select(HISTORY, protected_from_seq=13, over_by=over_by).rows))
        assert ({4, 5, 7} <= picked) or not ({4, 5, 7} & picked), over_by
        assert 13 not in picked


def test_the_estimate_is_the_providers_count_plus_the_rows_since() -> None:
    sent = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [
        EstimatedRow(500, sent - timedelta(seconds=1)),
        EstimatedRow(70, sent + timedelta(seconds=1)),
    ]
    # The provider counted the 530 of ours as 1000: the new row counts at the same rate.
    assert LastCall(1000, sent, counted=500).ratio == 2.0
    assert request_estimate(fixed=30, rows=rows, last=LastCall(1000, sent, counted=500)) == 1140
    assert request_estimate(fixed=30, rows=rows, last=LastCall(1000, sent, counted=1000)) == 1070
    # Rows set aside since: everything, at the provider's rate.
    moved = LastCall(1000, sent, counted=500, moved_since=True)
    assert request_estimate(fixed=30, rows=rows, last=moved) == 1200
    assert request_estimate(fixed=30, rows=rows, last=None) == 600
    # A count far off ours calibrates no further than 4x either way.
    assert LastCall(10_000, sent, counted=100).ratio == 4.0
    assert LastCall(1, sent, counted=100).ratio == 0.25
    assert LastCall(5, sent, counted=0).ratio == 1.0
    assert row_tokens("x" * 2000) == 504  # 2,000 characters, a message's framing
    assert target_tokens(window=16000, reserve=1000, margin_percent=20) == 11800


def too_big(kept: int, reserve: int, window: int, *, known: bool = True) -> str:
    plan = Plan(
        act="too_big",
        policy="trim",
        rows=[],
        tokens=0,
        estimate=kept,
        window=window,
        reserve=reserve,
        kept_tokens=kept,
        trigger="refusal",
        window_known=known,
    )
    return too_big_error(plan).message


def test_a_turn_that_alone_is_refused_is_told_by_whether_our_estimate_fits_the_window() -> None:
    assert too_big(900, 500, 1000) == (
        "the newest turn alone (about 900 tokens with the system prompt and tools, and 500 kept "
        "for the answer) does not fit the model's window of 1000 tokens; nothing was set aside"
    )
    # 70 < 300: the provider counted otherwise, and the message says so with our numbers.
    assert too_big(6, 64, 300) == (
        "the provider refused even the newest turn alone as too long (our estimate: about 6 "
        "tokens with the system prompt and tools, and 64 kept for the answer, against the "
        "model's window of 300 tokens); nothing was set aside"
    )
    # No window configured or stated: the plan's window is the refused request's size.
    assert too_big(6, 64, 200, known=False) == (
        "the provider refused even the newest turn alone as too long (our estimate: about 6 "
        "tokens with the system prompt and tools, and 64 kept for the answer; no window is "
        "configured or stated); nothing was set aside"
    )


# --- the selection at its edges ---------------------------------------------------------------


def test_a_system_note_is_a_unit_of_its_own_whatever_row_follows_it() -> None:
    # A turn that failed after a second message came leaves its note between the messages and
    # the next turn's answer: that answer starts a unit of its own (architecture.md §5.9).
    rows = [
        row(1, "user"),
        row(2, "assistant"),
        row(3, "system-note", "[inference-failed] ...", note=True),
        row(4, "assistant"),
        row(5, "system-note", "[context-trim] ...", note=True),
        row(6, "system-note", "[inference-failed] ...", note=True),
        row(7, "user"),
    ]
    assert [seqs(u.rows) for u in units_of(rows)] == [[1, 2], [3], [4], [5], [6], [7]]


def test_a_single_message_is_not_a_note_so_a_newer_note_goes_before_it() -> None:
    rows = [
        row(1, "user"),
        row(2, "system-note", "[inference-failed] ...", note=True),
        row(3, "user"),
    ]
    assert seqs(select(rows, protected_from_seq=3, over_by=50).rows) == [2]
    assert seqs(select(rows, protected_from_seq=3, over_by=150).rows) == [1, 2]


def test_exactly_the_tokens_asked_for_set_aside_no_more_units() -> None:
    # The note alone is 100 tokens: asked for 100, it alone goes and that fits.
    assert select(HISTORY, protected_from_seq=13, over_by=100) == Selection(
        rows=[HISTORY[8]], tokens=100, fits=True, kept_tokens=100
    )
    # Everything before the current turn is exactly 1200: it all goes, and fits.
    everything = select(HISTORY, protected_from_seq=13, over_by=1200)
    assert seqs(everything.rows) == list(range(1, 13)) and everything.fits
    assert everything.tokens == 1200


def test_nothing_over_sets_nothing_aside_and_fits() -> None:
    assert select(HISTORY, protected_from_seq=13, over_by=0) == Selection(
        rows=[], tokens=0, fits=True, kept_tokens=100
    )


def test_when_not_enough_can_go_nothing_goes_and_the_current_turn_is_counted() -> None:
    assert select(HISTORY, protected_from_seq=12, over_by=901) == Selection(
        rows=[], tokens=0, fits=False, kept_tokens=400
    )
    # Without trigger rows, the newest unit alone is the current turn's.
    assert select(HISTORY, protected_from_seq=None, over_by=1201) == Selection(
        rows=[], tokens=0, fits=False, kept_tokens=100
    )


def test_a_unit_ending_at_the_first_trigger_row_is_the_current_turns() -> None:
    rows = [row(1, "user"), row(2, "assistant"), row(3, "user"), row(4, "assistant")]
    picked = select(rows, protected_from_seq=2, over_by=1)
    assert picked == Selection(rows=[], tokens=0, fits=False, kept_tokens=400)
    picked = select(rows, protected_from_seq=3, over_by=1)
    assert seqs(picked.rows) == [1, 2] and picked.kept_tokens == 200


# --- the estimate at its edges ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "tokens"),
    [
        ("", 0),
        ("abcd", 1),
        ("abcde", 2),  # a character more is a token more: rounded up
        ("x" * 4001, 1001),
        # Not text: its JSON, non-ASCII characters counted as themselves, not as escapes.
        (["\u00e9t\u00e9"], 2),  # ["été"]: 7 characters
        ({"a": 1}, 2),  # {"a": 1}: 8 characters
    ],
)
def test_a_values_tokens_are_its_characters_over_four_rounded_up(value: Any, tokens: int) -> None:
    assert text_tokens(value) == tokens


def test_a_message_counts_its_framing_beside_its_text() -> None:
    assert row_tokens("abcd") == 5
    assert row_tokens("") == 4


def test_the_system_prompt_and_the_tools_count_only_when_there_are_some() -> None:
    assert fixed_tokens("", []) == 0
    assert fixed_tokens("abcdefgh", []) == 2 + 4  # a message's framing with it
    tools = [{"name": "t"}]  # [{"name": "t"}]: 15 characters
    assert fixed_tokens("", tools) == 4
    assert fixed_tokens("abcdefgh", tools) == 2 + 4 + 4


def test_the_providers_ratio_is_its_count_over_ours_within_four_times_either_way() -> None:
    assert ratio(reported=3, counted=1) == 3.0
    assert ratio(reported=400, counted=100) == 4.0
    assert ratio(reported=25, counted=100) == 0.25
    assert ratio(reported=401, counted=100) == 4.0
    assert ratio(reported=24, counted=100) == 0.25
    assert ratio(reported=100, counted=0) == ratio(reported=100, counted=-1) == 1.0


def test_a_row_written_as_the_call_was_sent_was_in_its_count() -> None:
    sent = datetime(2026, 1, 1, tzinfo=UTC)
    rows = [EstimatedRow(70, sent), EstimatedRow(30, sent + timedelta(microseconds=1))]
    assert request_estimate(fixed=30, rows=rows, last=LastCall(1000, sent, counted=500)) == 1060


def test_the_target_is_the_window_less_its_margin_less_the_reserve_never_below_zero() -> None:
    assert target_tokens(window=1001, reserve=0, margin_percent=10) == 900  # 900.9, whole tokens
    assert target_tokens(window=1000, reserve=100, margin_percent=0) == 900
    assert target_tokens(window=1000, reserve=900, margin_percent=10) == 0
    assert target_tokens(window=1000, reserve=2000, margin_percent=0) == 0
