"""The ``[inference-failed]`` note written into an agent's history (architecture.md §5.8)."""

from __future__ import annotations

from agentops.text import NOTE_TEXT_LIMIT, bound_text
from calls.types import ProviderError

CLOSING = "If a reply is still owed from that turn, you can give it now."
TIMED_OUT_AGAIN = "The call was made again, and it timed out again."


def _closed(text: str) -> str:
    """``text`` ending its sentence once: a provider's message often ends with its own period."""
    return text if text.endswith((".", "!", "?")) else f"{text}."


def failure_note_text(error: ProviderError, *, timed_out_again: bool = False) -> str:
    reason = _closed(bound_text(error.message, NOTE_TEXT_LIMIT))
    if error.type == "timeout":
        parts = [f"[inference-failed] The model call timed out: {reason}"]
        if timed_out_again:
            parts.append(TIMED_OUT_AGAIN)
        parts.append(CLOSING)
        return " ".join(parts)
    if error.provider_code == "answer_unstorable":
        return (
            "[inference-failed] The model answered, but its answer could not be stored: "
            f"{reason} {CLOSING}"
        )
    cause = error.type if error.http_status is None else f"{error.type}, HTTP {error.http_status}"
    return f"[inference-failed] The model call failed ({cause}): {reason} {CLOSING}"
