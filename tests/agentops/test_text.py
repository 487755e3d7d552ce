"""Bounding failure text (architecture.md §5.6), cleaning a release's requester (architecture.md
§6.8), and making text and JSON from outside storable (architecture.md §15)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from agentops.text import (
    DATA_DEPTH_LIMIT,
    DATA_ITEMS_LIMIT,
    DATA_KEY_LIMIT,
    FAILURE_TEXT_LIMIT,
    NOTE_TEXT_LIMIT,
    PROVIDER_CODE_LIMIT,
    bound_data,
    bound_text,
    clean_requester,
    redact_secrets,
    untrusted_json,
    untrusted_json_text,
    untrusted_text,
    visible_controls,
)

MARKER = re.compile(r" …\[(\d+) of (\d+) characters omitted\]… ")
LIMITS = [FAILURE_TEXT_LIMIT, NOTE_TEXT_LIMIT, PROVIDER_CODE_LIMIT]
# Distinct letters, so a head or tail in the wrong place can't match by accident.
ALPHABET = "".join(chr(65 + i % 26) + chr(97 + i % 23) for i in range(600_000))
GRINNING = "\U0001f600"  # 😀: one code point, a surrogate pair in UTF-16
# The same emoji as two surrogate code points, as a CESU-8 / modified UTF-8 decode produces it.
SPLIT_PAIR = b"\xed\xa0\xbd\xed\xb8\x80".decode("utf-8", "surrogatepass")


def text_of(length: int) -> str:
    return ALPHABET[:length]


def parts(result: str) -> tuple[str, int, int, str]:
    """(head, omitted, total, tail) of a bounded text with exactly one marker."""
    [match] = list(MARKER.finditer(result))
    return result[: match.start()], int(match[1]), int(match[2]), result[match.end() :]


def assert_bounded(result: str, original: str, limit: int) -> None:
    assert len(result) == limit
    head, omitted, total, tail = parts(result)
    assert total == len(original)
    assert original.startswith(head)
    assert original.endswith(tail)
    assert omitted == len(original) - len(head) - len(tail)
    assert len(head) >= len(tail) > 0


def has_unpaired_surrogate(text: str) -> bool:
    i = 0
    while i < len(text):
        ch = text[i]
        if "\ud800" <= ch <= "\udbff" and i + 1 < len(text) and "\udc00" <= text[i + 1] <= "\udfff":
            i += 2
            continue
        if "\ud800" <= ch <= "\udfff":
            return True
        i += 1
    return False


def test_the_limits_are_the_designed_ones() -> None:
    assert (FAILURE_TEXT_LIMIT, NOTE_TEXT_LIMIT, PROVIDER_CODE_LIMIT) == (2_000, 600, 128)


def test_the_default_limit_is_2000() -> None:
    assert len(bound_text(text_of(5_000))) == 2_000
    assert bound_text(text_of(2_000)) == text_of(2_000)


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("under", [0, 1, 2])
def test_a_text_at_or_under_the_limit_is_unchanged(limit: int, under: int) -> None:
    for text in (text_of(limit - under), GRINNING * (limit - under), ""):
        assert bound_text(text, limit) is text


@pytest.mark.parametrize(
    ("limit", "length"),
    [
        (2_000, 2_010),
        (2_000, 2_064),
        (2_000, 2_100),
        (2_000, 3_000),
        (2_000, 50_000),
        (2_000, 1_000_000),
        (600, 610),
        (600, 700),
        (600, 1_600),
        (600, 1_000_000),
        (128, 138),
        (128, 228),
        (128, 1_128),
        (128, 1_000_000),
    ],
)
def test_a_longer_text_keeps_head_and_tail_around_a_marker_with_the_counts(
    limit: int, length: int
) -> None:
    original = text_of(length)
    assert_bounded(bound_text(original, limit), original, limit)


_MARKER_BUG = (
    "BUG: the marker is sized with the count len(text) - limit, but the real count is larger; "
    "when it has one more digit the result is limit + 1 long and result[:limit] drops the "
    "text's last character, so the tail is not the text's end and the count is off by one"
)


@pytest.mark.parametrize(
    ("limit", "length"),
    [
        (2_000, 2_001),
        (2_000, 2_009),
        (2_000, 2_065),
        (2_000, 2_999),
        (2_000, 11_999),
        (600, 601),
        (600, 699),
        (600, 1_599),
        (128, 129),
        (128, 227),
        (128, 1_127),
    ],
)
def test_the_marker_counts_stay_right_when_the_count_gains_a_digit(limit: int, length: int) -> None:
    original = text_of(length)
    assert_bounded(bound_text(original, limit), original, limit)


def test_a_text_just_over_the_limit_keeps_its_last_character() -> None:
    original = "x" * 1_990 + "END-OF-TEXT"
    result = bound_text(original)
    assert result.endswith("END-OF-TEXT")


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize(
    "text", [GRINNING * 3_000, ("a" + GRINNING) * 1_500, "\u00e9" + GRINNING * 4_999]
)
def test_an_emoji_text_stays_valid(limit: int, text: str) -> None:
    result = bound_text(text, limit)
    assert result.encode("utf-16", "surrogatepass").decode("utf-16") == result
    assert result.encode("utf-8")  # no lone surrogate (that would raise)
    assert not any("\ud800" <= ch <= "\udfff" for ch in result)
    assert_bounded(result, text, limit)


@pytest.mark.parametrize("limit", LIMITS)
@pytest.mark.parametrize("prefix", ["", "a"])
@pytest.mark.parametrize("pairs", [1_500, 1_501, 25_000])
def test_a_surrogate_pair_is_never_split_at_a_cut(limit: int, prefix: str, pairs: int) -> None:
    # Each emoji is two code points here, so a cut could fall between them.
    text = prefix + SPLIT_PAIR * pairs
    result = bound_text(text, limit)
    assert len(result) <= limit
    assert not has_unpaired_surrogate(result)
    assert result.encode("utf-16", "surrogatepass").decode("utf-16")


@pytest.mark.parametrize(("limit", "pairs"), [(2_000, 1_482), (600, 782), (128, 546)])
def test_the_final_cut_never_leaves_half_a_surrogate_pair(limit: int, pairs: int) -> None:
    result = bound_text(SPLIT_PAIR * pairs, limit)
    assert len(result) <= limit
    assert not has_unpaired_surrogate(result)


# -- clean_requester ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "cleaned"),
    [
        ("alice", "alice"),
        ("  alice  ", "alice"),
        ("al\nice", "al ice"),
        ("\n\r\talice\x00", "alice"),
        ("a\tb\rc\x00d\x1fe\x7ff\x85g\x9fh", "a b c d e f g h"),
        ("ops team \u00e9 \u03a9 " + GRINNING, "ops team \u00e9 \u03a9 " + GRINNING),
        ("", ""),
        ("\x00\x01\x02", ""),
    ],
)
def test_control_characters_in_a_requester_become_spaces(value: str, cleaned: str) -> None:
    assert clean_requester(value) == cleaned


@pytest.mark.parametrize(
    ("value", "cleaned"),
    [
        ("x" * 200, "x" * 200),
        ("x" * 201, "x" * 200),
        ("x" * 100_000, "x" * 200),
        ("\n" * 50 + "y" * 300, "y" * 200),
        (GRINNING * 250, GRINNING * 200),
    ],
)
def test_a_requester_is_bounded_to_200_characters(value: str, cleaned: str) -> None:
    assert clean_requester(value) == cleaned


def test_the_requester_limit_is_a_parameter() -> None:
    assert clean_requester("abcdef", limit=3) == "abc"


@pytest.mark.parametrize("value", ["a" * 199 + " b", "a" * 199 + "\nb"])
def test_a_bounded_requester_does_not_end_in_a_space(value: str) -> None:
    assert clean_requester(value) == "a" * 199


# --- bounding JSON-like data (an alert's data, a failures.log record) --------------------------


def test_bounded_data_bounds_every_string_however_deep() -> None:
    big = text_of(1_000_000)
    data = bound_data(
        {"error": {"message": big, "codes": [big, "short"]}, "n": 3, "ok": True, "none": None}
    )
    assert_bounded(data["error"]["message"], big, FAILURE_TEXT_LIMIT)
    assert_bounded(data["error"]["codes"][0], big, FAILURE_TEXT_LIMIT)
    assert (
        data["error"]["codes"][1] == "short"
        and data["n"] == 3
        and data["ok"] is True
        and data["none"] is None
    )


def test_bounded_data_keeps_the_first_100_entries_of_a_list_or_an_object_and_says_what_it_left_out() -> (
    None
):
    data = bound_data(
        {
            "list": list(range(1000)),
            "object": {f"k{i}": i for i in range(1000)},
            "tuple": tuple(range(101)),
        }
    )
    assert data["list"] == list(range(DATA_ITEMS_LIMIT))
    assert data["tuple"] == list(range(DATA_ITEMS_LIMIT))
    obj = data["object"]
    assert [obj[f"k{i}"] for i in range(DATA_ITEMS_LIMIT)] == list(range(DATA_ITEMS_LIMIT))
    assert len(obj) == DATA_ITEMS_LIMIT + 1 and obj["…"] == "900 more entries omitted"


def test_bounded_data_cuts_keys_and_nesting() -> None:
    nested: Any = "bottom"
    for _ in range(50):
        nested = {"down": [nested]}
    data = bound_data({"k" * 1000: 1, "nested": nested})
    assert "k" * DATA_KEY_LIMIT in data and len(next(iter(data))) == DATA_KEY_LIMIT
    depth, value = 0, data["nested"]
    while isinstance(value, dict | list):
        value = value["down"] if isinstance(value, dict) else value[0]
        depth += 1
    assert depth == DATA_DEPTH_LIMIT - 1 and "nested too deep" in value
    assert len(json.dumps(data)) < 2_000


def test_bounded_data_leaves_small_data_as_it_was() -> None:
    data = {
        "turn": 7,
        "error": {
            "type": "server",
            "message": "HTTP 503",
            "http_status": 503,
            "retry_after_ms": None,
        },
        "tags": ["a", "b"],
    }
    assert bound_data(data) == data


def _marker(omitted: int, total: int) -> str:
    return f" …[{omitted} of {total} characters omitted]… "


def reference_bound(text: str, limit: int) -> str:
    """The rule by search: keep the most characters ``keep`` such that ``keep`` plus the marker
    stating ``len(text) - keep`` fits in ``limit``; head gets the odd one."""
    total = len(text)
    if total <= limit:
        return text
    keep = next((k for k in range(limit, -1, -1) if k + len(_marker(total - k, total)) <= limit), 0)
    tail = text[total - keep // 2 :] if keep // 2 else ""
    return text[: (keep + 1) // 2] + _marker(total - keep, total) + tail


@pytest.mark.parametrize("limit", [40, 60, 128])
def test_the_cut_keeps_the_most_text_the_limit_allows_for_every_length_across_digit_changes(
    limit: int,
) -> None:
    # Where the omitted count gains a digit, two counts can each be stated truthfully (one more
    # character left out, one more digit in the marker): the cut keeps the extra character.
    for length in range(limit + 1, 1_200):
        text = text_of(length)
        assert bound_text(text, limit) == reference_bound(text, limit), length


def test_a_limit_too_small_for_the_marker_keeps_the_marker_alone() -> None:
    assert bound_text(text_of(100), 5) == _marker(100, 100)
    assert bound_text(text_of(100), 0) == _marker(100, 100)


@pytest.mark.parametrize("kept", [1, 2, 3])
def test_a_limit_just_over_the_marker_keeps_the_head_first_then_the_tail(kept: int) -> None:
    text = text_of(1_000)
    limit = len(_marker(1_000 - kept, 1_000)) + kept
    result = bound_text(text, limit)
    assert result == text[: (kept + 1) // 2] + _marker(1_000 - kept, 1_000) + (
        text[-(kept // 2) :] if kept // 2 else ""
    )
    assert len(result) == limit


@pytest.mark.parametrize("high", ["\ud800", "\udbff"])
def test_a_lone_high_surrogate_at_the_end_of_the_head_is_dropped(high: str) -> None:
    text = "ab" + high + "z" * 1_000  # the head keeps 3 characters
    limit = len(_marker(1_000, 1_003)) + 5
    head, _, _, _ = parts(bound_text(text, limit))
    assert head == "ab"


@pytest.mark.parametrize("low", ["\udc00", "\udfff"])
def test_a_lone_low_surrogate_at_the_start_of_the_tail_is_dropped(low: str) -> None:
    text = "z" * 1_000 + low + "ab"  # the tail keeps 3 characters
    limit = len(_marker(997, 1_003)) + 6
    _, _, _, tail = parts(bound_text(text, limit))
    assert tail == "ab"


@pytest.mark.parametrize("edge", ["\ud7ff", "\ue000", "\udc00"])
def test_a_character_just_outside_the_high_surrogates_stays_at_the_end_of_the_head(
    edge: str,
) -> None:
    text = "ab" + edge + "z" * 1_000
    limit = len(_marker(1_000, 1_003)) + 5
    head, _, _, _ = parts(bound_text(text, limit))
    assert head == "ab" + edge


def test_a_no_break_space_in_a_requester_is_kept() -> None:
    assert clean_requester("ops\u00a0team") == "ops\u00a0team"
    assert clean_requester("ops\u009fteam") == "ops team"


def test_bounded_data_keeps_exactly_100_entries_whole() -> None:
    data = {f"k{i}": i for i in range(DATA_ITEMS_LIMIT)}
    assert bound_data(data) == data
    assert bound_data(list(range(DATA_ITEMS_LIMIT))) == list(range(DATA_ITEMS_LIMIT))


@pytest.mark.parametrize(
    ("value", "cleaned"),
    [
        ("ops\ud800team", "ops\ufffdteam"),
        ("ops\udfffteam", "ops\ufffdteam"),
        ("\udbff\udc00", "\ufffd\ufffd"),  # a pair as two code points is still not storable
        ("ops\ud7ffteam", "ops\ud7ffteam"),  # the code points either side are not surrogates
        ("ops\ue000team", "ops\ue000team"),
    ],
)
def test_a_lone_surrogate_in_a_requester_becomes_a_replacement_character(
    value: str, cleaned: str
) -> None:
    assert clean_requester(value) == cleaned


# --- text and JSON from outside (a provider's answer, error or header) ------------------------


@pytest.mark.parametrize(
    ("text", "safe"),
    [
        ("plain ascii text", "plain ascii text"),
        ("a\x00b", "a\ufffdb"),
        ("caf\u00e9 \ud800 x", "caf\u00e9 \ufffd x"),
        ("\udfff", "\ufffd"),
        ("\ud7ff\ue000 caf\u00e9 " + GRINNING, "\ud7ff\ue000 caf\u00e9 " + GRINNING),
    ],
    ids=["ascii", "nul", "lone-high-surrogate", "lone-low-surrogate", "storable-non-ascii"],
)
def test_text_from_outside_has_each_nul_and_lone_surrogate_replaced(text: str, safe: str) -> None:
    assert untrusted_text(text) == safe


def test_json_from_outside_is_parsed_with_every_escaped_nul_and_surrogate_replaced() -> None:
    raw = r'{"k\u0000": ["a\ud800", {"b": "\u0000", "c": [1, "ok", ["\udfff"]]}], "plain": "x"}'
    assert untrusted_json(raw) == {
        "k\ufffd": ["a\ufffd", {"b": "\ufffd", "c": [1, "ok", ["\ufffd"]]}],
        "plain": "x",
    }
    assert untrusted_json(r'"\u0000 alone"') == "\ufffd alone"
    assert untrusted_json('{"a": [1, "caf\u00e9"]}') == {"a": [1, "caf\u00e9"]}


def test_json_bytes_from_outside_are_read_as_utf8_with_an_invalid_byte_replaced() -> None:
    assert untrusted_json(b'{"a": "x\xffy \xc3\xa9"}') == {"a": "x\ufffdy \u00e9"}


def test_json_nested_too_deep_for_the_parser_is_a_value_error() -> None:
    with pytest.raises(ValueError) as caught:
        untrusted_json("[" * 100_000 + "]" * 100_000)
    assert str(caught.value) == "the JSON nests too deep to read"
    with pytest.raises(ValueError):
        untrusted_json("not json")


@pytest.mark.parametrize(
    ("raw", "relayed"),
    [
        # Without an escape of NUL or a surrogate the text is relayed as it came, spacing and all.
        ('{"a":1,  "b":"caf\u00e9"}', '{"a":1,  "b":"caf\u00e9"}'),
        ('{"a": "caf\u00e9 \\u0000"}', '{"a": "caf\u00e9 \ufffd"}'),
        ('{"a": ["\\ud800"]}', '{"a": ["\ufffd"]}'),
        # Not JSON: made safe as text, its escapes left as they are.
        ("broken \\u0000 \x00 {", "broken \\u0000 \ufffd {"),
        ("not json \x00", "not json \ufffd"),
    ],
    ids=["clean", "escaped-nul", "escaped-surrogate", "escape-in-broken-json", "broken-json"],
)
def test_json_text_from_outside_is_relayed_unchanged_unless_it_escapes_a_nul_or_a_surrogate(
    raw: str, relayed: str
) -> None:
    assert untrusted_json_text(raw) == relayed


# --- provider keys redacted (architecture.md §15) ----------------------------------------------

KEY = "sk-proj-Abc123Def456Ghi789"


@pytest.mark.parametrize(
    ("said", "kept"),
    [
        (f"key {KEY} refused", "key [redacted] refused"),
        # Its first 8 characters or more, then whatever masks the rest.
        (f"key {KEY[:8]}****i789", "key [redacted]****i789"),
        (f"key {KEY[:11]}...", "key [redacted]..."),
        # 7 are not enough to name it.
        (f"key {KEY[:7]}****", f"key {KEY[:7]}****"),
        (f"{KEY}{KEY}", "[redacted][redacted]"),
        # The credential forms, whatever the value.
        ("authorization: Bearer abc.def-ghi", "authorization: Bearer [redacted]"),
        ("AUTHORIZATION: bearer abc", "AUTHORIZATION: bearer [redacted]"),
        ("x-api-key: zzz-999 was refused", "x-api-key: [redacted] was refused"),
        ('{"x-goog-api-key": "zzz"}', '{"x-goog-api-key": "[redacted]"}'),
        ("?api_key=zzz&b=1", "?api_key=[redacted]&b=1"),
        ("Bearer [redacted]", "Bearer [redacted]"),
        ("an API key provided: no", "an API key provided: no"),
    ],
)
def test_a_key_and_the_forms_a_credential_is_written_in_are_redacted(said: str, kept: str) -> None:
    assert redact_secrets(said, (KEY,)) == kept


def test_a_redacted_json_body_is_still_json_and_text_without_a_secret_is_the_same_string() -> None:
    body = json.dumps({"error": {"message": f"authorization: Bearer {KEY}", "key": KEY}})
    assert json.loads(redact_secrets(body, (KEY,))) == {
        "error": {"message": "authorization: Bearer [redacted]", "key": "[redacted]"}
    }
    plain = "nothing secret here, " * 10
    assert redact_secrets(plain, (KEY,)) is plain


def test_a_key_too_short_to_be_one_is_not_redacted_everywhere() -> None:
    assert redact_secrets("the test passed", ("tes",)) == "the test passed"
    assert redact_secrets("the test passed", ("test",)) == "the [redacted] passed"
    # A key too short to redact is passed over, not the end of the keys to look for.
    assert redact_secrets(f"tes {KEY}", ("tes", KEY)) == "tes [redacted]"


def test_every_place_a_key_is_echoed_is_redacted_however_it_ends() -> None:
    assert redact_secrets(f"{KEY} then {KEY} and {KEY}", (KEY,)) == (
        "[redacted] then [redacted] and [redacted]"
    )
    # A message cut short in the middle of the key: what is left of it goes.
    assert redact_secrets(f"refused key {KEY[:11]}", (KEY,)) == "refused key [redacted]"


# --- control characters shown, not acted on (architecture.md §15) ------------------------------


@pytest.mark.parametrize(
    ("said", "shown"),
    [
        # A colour sequence a provider's proxy left in its error: seen, not obeyed.
        ("\x1b[31mupstream failed\x1b[0m", "\\x1b[31mupstream failed\\x1b[0m"),
        # A lone CR would rewrite the log line it is written on.
        ("quota ok\rquota exceeded", "quota ok\\x0dquota exceeded"),
        # A CRLF line end is a line end: kept as a newline, beside a control that is shown.
        ("line one\r\nline two\x07", "line one\nline two\\x07"),
        ("\x00\x08\x0b\x0c\x1f", "\\x00\\x08\\x0b\\x0c\\x1f"),
        # DEL and the C1 controls (a terminal acts on U+009B as on ESC [).
        ("a\x7fb\x85c\x9bd\x9f", "a\\x7fb\\x85c\\x9bd\\x9f"),
    ],
    ids=["ansi-colour", "lone-cr", "crlf-and-bell", "c0", "del-and-c1"],
)
def test_a_control_character_in_a_providers_text_is_shown_as_its_escape(
    said: str, shown: str
) -> None:
    assert visible_controls(said) == shown


@pytest.mark.parametrize(
    "said",
    ["plain words", "tab\tand\nnewline", "caf\u00e9 \u00a0 \u00ff " + GRINNING],
    ids=["plain", "tab-and-newline", "printable-non-ascii"],
)
def test_text_without_a_control_character_is_the_same_string(said: str) -> None:
    assert visible_controls(said) is said
