"""A small Server-Sent Events parser that keeps comments (they are keepalives, architecture.md §5.2)."""

from __future__ import annotations

from dataclasses import dataclass

from agentops.text import untrusted_text


@dataclass
class SseEvent:
    event: str
    data: str
    comment: bool = False


class SseParser:
    """Feed decoded lines (without their line ending); collect complete events."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed_line(self, line: str) -> SseEvent | None:
        """``line`` as the provider sent it (decoded, U+FFFD for invalid UTF-8): made safe
        (``untrusted_text``) before it is kept or relayed."""
        if "\x00" in line:
            line = untrusted_text(line)
        if line == "":
            if not self._data and not self._event:
                return None
            event = SseEvent(self._event or "message", "\n".join(self._data))
            self._event, self._data = "", []
            return event
        if line.startswith(":"):
            return SseEvent("", line[1:].strip(), comment=True)
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None
