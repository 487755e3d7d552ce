"""A small Server-Sent Events parser that keeps comments (they are keepalives, architecture.md §5.2)."""

from __future__ import annotations

from dataclasses import dataclass

from agentops.outbound import ResponseRefused
from agentops.text import untrusted_text


@dataclass
class SseEvent:
    event: str
    data: str
    comment: bool = False


class SseParser:
    """Feed decoded lines (without their line ending); collect complete events, each at most
    ``event_limit`` bytes of data (its ``data:`` lines joined, in UTF-8)."""

    def __init__(self, event_limit: int) -> None:
        self._event = ""
        self._data: list[str] = []
        self._size = 0
        self._limit = event_limit

    def feed_line(self, line: str) -> SseEvent | None:
        """``line`` as the provider sent it (decoded, U+FFFD for invalid UTF-8): made safe
        (``untrusted_text``) before it is kept or relayed. Raises ResponseRefused
        (``event_too_large``) once the event being collected passes its limit."""
        if "\x00" in line:
            line = untrusted_text(line)
        if line == "":
            if not self._data and not self._event:
                return None
            event = SseEvent(self._event or "message", "\n".join(self._data))
            self._event, self._data, self._size = "", [], 0
            return event
        if line.startswith(":"):
            return SseEvent("", line[1:].strip(), comment=True)
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            # ``data:`` lines with no blank line between them are one event: bounded like a
            # line, or a stream of them is held whole up to the stream's limit. (isascii is a
            # flag, not a scan; the newline that joins them counts.)
            self._size += 1 + (len(value) if value.isascii() else len(value.encode()))
            if self._size > self._limit:
                raise ResponseRefused(
                    "event_too_large",
                    f"an event of the stream was larger than {self._limit} bytes, so it was not "
                    "read further (the limit: AGENTOPS_PROVIDER_MAX_EVENT_BYTES)",
                )
            self._data.append(value)
        return None
