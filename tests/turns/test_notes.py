"""The ``[inference-failed]`` note written into an agent's history (architecture.md §5.8)."""

from __future__ import annotations

import re

import pytest

from calls.types import ProviderError
from turns.notes import CLOSING, TIMED_OUT_AGAIN, failure_note_text

CUT_REASON = (
    "no model event for 150000 ms after content (between-events bound; the setting for this "
    "bound: AGENTOPS_INFERENCE_BOUNDS.progress_bounds.between_events_ms)"
)
MARKER = re.compile(r" …\[(\d+) of (\d+) characters omitted\]… ")


def cut(message: str = CUT_REASON) -> ProviderError:
    return ProviderError(type="timeout", message=message, bound="between_events")


def test_the_closing_and_timed_out_again_sentences_are_the_designed_ones() -> None:
    assert CLOSING == "If a reply is still owed from that turn, you can give it now."
    assert TIMED_OUT_AGAIN == "The call was made again, and it timed out again."


def test_a_timeout_note_says_the_call_timed_out_with_the_reason_and_closes() -> None:
    assert failure_note_text(cut()) == (
        "[inference-failed] The model call timed out: no model event for 150000 ms after content "
        "(between-events bound; the setting for this bound: "
        "AGENTOPS_INFERENCE_BOUNDS.progress_bounds.between_events_ms). "
        "If a reply is still owed from that turn, you can give it now."
    )


def test_a_timeout_after_a_fresh_call_says_it_timed_out_again() -> None:
    assert failure_note_text(cut(), timed_out_again=True) == (
        "[inference-failed] The model call timed out: no model event for 150000 ms after content "
        "(between-events bound; the setting for this bound: "
        "AGENTOPS_INFERENCE_BOUNDS.progress_bounds.between_events_ms). "
        "The call was made again, and it timed out again. "
        "If a reply is still owed from that turn, you can give it now."
    )


def test_a_408_is_a_timeout_note_too() -> None:
    error = ProviderError(
        type="timeout", message="Request Timeout", http_status=408, retryable=True
    )
    assert failure_note_text(error) == (
        "[inference-failed] The model call timed out: Request Timeout. "
        "If a reply is still owed from that turn, you can give it now."
    )


@pytest.mark.parametrize(
    ("error", "note"),
    [
        (
            ProviderError(
                type="server", message="Service unavailable", http_status=503, retryable=True
            ),
            "[inference-failed] The model call failed (server, HTTP 503): Service unavailable. "
            "If a reply is still owed from that turn, you can give it now.",
        ),
        (
            ProviderError(type="auth", message="Incorrect API key provided", http_status=401),
            "[inference-failed] The model call failed (auth, HTTP 401): "
            "Incorrect API key provided. "
            "If a reply is still owed from that turn, you can give it now.",
        ),
        (
            ProviderError(
                type="context_length",
                message="prompt is too long: 201873 tokens > 200000 maximum",
                http_status=400,
            ),
            "[inference-failed] The model call failed (context_length, HTTP 400): "
            "prompt is too long: 201873 tokens > 200000 maximum. "
            "If a reply is still owed from that turn, you can give it now.",
        ),
        (
            ProviderError(
                type="rate_limit", message="slow down", http_status=429, retry_after_ms=1_000
            ),
            "[inference-failed] The model call failed (rate_limit, HTTP 429): slow down. "
            "If a reply is still owed from that turn, you can give it now.",
        ),
        (
            ProviderError(
                type="network", message="ConnectError: connection refused", retryable=True
            ),
            "[inference-failed] The model call failed (network): ConnectError: connection refused. "
            "If a reply is still owed from that turn, you can give it now.",
        ),
        (
            ProviderError(
                type="unknown",
                message="the model stopped at its output limit with no text",
                provider_code="empty_length_stop",
            ),
            "[inference-failed] The model call failed (unknown): "
            "the model stopped at its output limit with no text. "
            "If a reply is still owed from that turn, you can give it now.",
        ),
    ],
    ids=[
        "server-503",
        "auth-401",
        "context-length-400",
        "rate-limit-429",
        "network-no-status",
        "unknown",
    ],
)
def test_another_failure_says_the_call_failed_with_type_and_http_status(
    error: ProviderError, note: str
) -> None:
    assert failure_note_text(error) == note
    # timed_out_again only ever applies to a timeout.
    assert failure_note_text(error, timed_out_again=True) == note


@pytest.mark.parametrize("length", [599, 600, 601, 2_000, 1_000_000])
@pytest.mark.parametrize("kind", ["timeout", "server"])
def test_the_reason_in_a_note_is_bounded_to_600_characters(length: int, kind: str) -> None:
    message = "R" + "e" * (length - 2) + "Z"
    error = ProviderError(
        type=kind, message=message, http_status=None if kind == "timeout" else 500
    )
    note = failure_note_text(error)
    prefix = (
        "[inference-failed] The model call timed out: "
        if kind == "timeout"
        else "[inference-failed] The model call failed (server, HTTP 500): "
    )
    suffix = ". " + CLOSING
    assert note.startswith(prefix) and note.endswith(suffix)
    reason = note[len(prefix) : -len(suffix)]
    if length <= 600:
        assert reason == message
    else:
        assert len(reason) <= 600
        assert reason.startswith("Ree")
        [marker] = MARKER.findall(reason)
        assert int(marker[1]) == length


def test_a_one_megabyte_reason_keeps_the_note_short() -> None:
    note = failure_note_text(cut("x" * 1_000_000), timed_out_again=True)
    assert len(note) < 600 + 200
    assert note.endswith(TIMED_OUT_AGAIN + " " + CLOSING)


@pytest.mark.parametrize("kind", ["timeout", "server"])
def test_a_reason_that_ends_its_own_sentence_is_not_given_a_second_period(kind: str) -> None:
    message = (
        "This model's maximum context length is 400 tokens. However, you requested 455 tokens "
        "(391 in the messages, 64 in the completion). Please reduce the length of the messages "
        "or completion."
    )
    note = failure_note_text(ProviderError(type=kind, message=message, http_status=400))
    assert note.endswith("messages or completion. " + CLOSING)
    assert ".." not in note
