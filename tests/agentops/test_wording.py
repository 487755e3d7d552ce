"""How durations, instants and excerpts read (agentops.wording)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from agentops.wording import duration_text, excerpt, instant_text


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (7_200_000, "2 h"),
        (1_200_000, "20 min"),
        (45_000, "45 s"),
        (5_400_000, "1 h 30 min"),
        (86_400_000, "1 d"),
        (90_000_000, "1 d 1 h"),
        (1500, "1.5 s"),
        (250, "250 ms"),
        (0, "0 ms"),
        (3_601_000, "1 h"),
        (61_000, "1 min 1 s"),
        (None, "until released"),
        (math.inf, "until released"),
    ],
)
def test_durations_read_as_people_say_them(ms: float | None, text: str) -> None:
    assert duration_text(ms) == text


def test_an_instant_reads_in_utc_to_the_second() -> None:
    assert instant_text(1_800_007_200_000) == "2027-01-15 10:00:00 UTC"
    assert (
        instant_text(datetime(2027, 1, 15, 10, 0, 0, 900_000, tzinfo=UTC))
        == "2027-01-15 10:00:00 UTC"
    )


def test_an_excerpt_is_cut_at_a_word_boundary_and_marked() -> None:
    text = "Agent ada is held on model answer until 2027-01-15 10:00:00 UTC: the provider asked"
    cut = excerpt(text, 40)
    assert len(cut) <= 40
    assert cut.endswith("…")
    assert text.startswith(cut[:-1])
    assert text[len(cut) - 1] == " "  # the cut fell between words
    assert excerpt("short text", 40) == "short text"
    assert excerpt("x" * 100, 10) == "x" * 9 + "…"
