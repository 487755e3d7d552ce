"""Text from outside made safe, and failure text bounded, before it is stored, logged or sent
(architecture.md §5.6, §15)."""

from __future__ import annotations

import json
import re
from typing import Any

FAILURE_TEXT_LIMIT = 2000
NOTE_TEXT_LIMIT = 600
PROVIDER_CODE_LIMIT = 128
DATA_KEY_LIMIT = 128
DATA_ITEMS_LIMIT = 100  # entries kept of each list or object
DATA_DEPTH_LIMIT = 8  # levels of nesting kept; deeper containers become a marker string


def bound_text(text: str, limit: int = FAILURE_TEXT_LIMIT) -> str:
    """Return ``text`` unchanged if it fits in ``limit`` characters, else head + marker + tail,
    at most ``limit`` characters, the marker saying how many characters were left out.

    Python strings hold code points, so a cut never splits a surrogate pair of a well-formed
    string; a lone surrogate (from a bad decode) at a cut edge is dropped, not kept half.
    """
    total = len(text)
    if total <= limit:
        return text
    # The marker's length depends on the count it states, and the count on the marker's
    # length: settle the two (a digit more or less changes the count by one).
    omitted = total - limit
    while True:
        keep = max(limit - len(_marker(omitted, total)), 0)
        if total - keep == omitted:
            break
        omitted = total - keep
    head = _strip_lone_surrogates(text[: (keep + 1) // 2])
    tail = _strip_lone_surrogates(text[total - keep // 2 :] if keep // 2 else "")
    return head + _marker(total - len(head) - len(tail), total) + tail


def bound_data(value: Any, *, _depth: int = 0) -> Any:
    """A JSON-like value (an alert's ``data``, a failures.log record) with every string bounded
    by ``bound_text``, keys cut to ``DATA_KEY_LIMIT`` characters, at most ``DATA_ITEMS_LIMIT``
    entries of each list and object, and at most ``DATA_DEPTH_LIMIT`` levels of nesting, so
    its size has a ceiling whatever a provider or caller put in it. Other scalars pass as is."""
    if isinstance(value, str):
        return bound_text(value)
    if isinstance(value, dict | list | tuple) and _depth >= DATA_DEPTH_LIMIT:
        return f"…[{len(value)} entries nested too deep, omitted]…"
    if isinstance(value, dict):
        items = list(value.items())
        kept = {
            str(k)[:DATA_KEY_LIMIT]: bound_data(v, _depth=_depth + 1)
            for k, v in items[:DATA_ITEMS_LIMIT]
        }
        if len(items) > DATA_ITEMS_LIMIT:
            kept["…"] = f"{len(items) - DATA_ITEMS_LIMIT} more entries omitted"
        return kept
    if isinstance(value, list | tuple):
        return [bound_data(v, _depth=_depth + 1) for v in value[:DATA_ITEMS_LIMIT]]
    return value


def _marker(omitted: int, total: int) -> str:
    return f" …[{omitted} of {total} characters omitted]… "


def _strip_lone_surrogates(part: str) -> str:
    if part and "\ud800" <= part[-1] <= "\udbff":
        part = part[:-1]
    if part and "\udc00" <= part[0] <= "\udfff":
        part = part[1:]
    return part


def clean_requester(value: str, limit: int = 200) -> str:
    """Control characters become spaces and lone surrogates (which cannot be stored) U+FFFD;
    the result is stripped and bounded."""
    cleaned = "".join(
        " "
        if (ord(ch) < 32 or 127 <= ord(ch) < 160)
        else "\ufffd"
        if 0xD800 <= ord(ch) <= 0xDFFF
        else ch
        for ch in value
    )
    return cleaned.strip()[:limit].rstrip()


# What PostgreSQL cannot store and UTF-8 cannot encode. (A str that JSON or UTF-8 decoding made
# holds a surrogate only alone: a pair is decoded into the one code point it stands for.)
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# A JSON escape that decodes to one of them; no other escape needs the decoded value walked.
_UNSTORABLE_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


def untrusted_text(text: str) -> str:
    """Text that came from outside (a provider's answer, error or header) as the service may
    store, log and send it: each NUL and each lone surrogate becomes U+FFFD. Every path that
    takes a provider's text passes it here (or through ``untrusted_json``)."""
    if "\x00" in text or not text.isascii():
        return _UNSTORABLE.sub("\ufffd", text)
    return text


# C0 controls but tab and newline, DEL and C1: a terminal or log viewer acts on them (ESC starts
# a colour or cursor sequence, CR rewrites a line), so a provider's error text shows them escaped.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible_controls(text: str) -> str:
    """A provider's error text (a message, a code) with each control character shown as its
    escape (``\\x1b``), so it is seen and does nothing; a CRLF line end is kept as a newline.
    NUL is U+FFFD already (``untrusted_text``); here it would show as ``\\x00``."""
    if not _CONTROLS.search(text):
        return text
    return _CONTROLS.sub(lambda m: f"\\x{ord(m.group()):02x}", text.replace("\r\n", "\n"))


REDACTED = "[redacted]"
# A key's first characters that identify it: a provider that echoes a key masked
# ("sk-proj-abcd****wxyz") or cut short still shows this many of them.
KEY_HEAD = 8
# Shorter "keys" are no secret worth the damage: redacting every "test" in a message.
KEY_SHORTEST = 4
# The forms a credential is written in whatever its value: an echoed header
# (``authorization: Bearer <value>``, ``x-api-key: <value>``, Google's ``x-goog-api-key``) or a
# parameter (``api_key=<value>``). The value ends where a quote, a space or JSON's punctuation
# does, so a redacted JSON body is still JSON.
_CREDENTIAL_FORMS = re.compile(
    r"(\bbearer\s+|\bapi[-_]?key[\"']?\s*[:=]\s*[\"']?)[^\s\"'`,;&<>\\]+", re.IGNORECASE
)


def redact_secrets(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with each of ``secrets`` replaced by ``[redacted]``: the whole secret, or any
    run of its first ``KEY_HEAD`` or more characters (a secret shorter than that, whole; one
    shorter than ``KEY_SHORTEST``, not at all); and the value of every ``Bearer <value>``,
    ``x-api-key: <value>`` or ``api_key=<value>`` form, whatever the value. The same string
    comes back when there was nothing to redact."""
    for secret in secrets:
        if len(secret) < KEY_SHORTEST:
            continue
        head = secret[:KEY_HEAD]
        start = text.find(head)
        while start != -1:
            end, size = start + len(head), len(secret)
            # As far as the text goes on spelling the secret.
            while end - start < size and end < len(text) and text[end] == secret[end - start]:
                end += 1
            text = text[:start] + REDACTED + text[end:]
            start = text.find(head, start + len(REDACTED))
    return _CREDENTIAL_FORMS.sub(_value_redacted, text)


def _value_redacted(found: re.Match[str]) -> str:
    return found.group(1) + REDACTED


def untrusted_json(raw: str | bytes) -> Any:
    """A provider's JSON (bytes are read as UTF-8, an invalid byte as U+FFFD), parsed, its
    strings and keys passed through ``untrusted_text``. Raises ValueError for what is not JSON,
    nesting too deep for the parser among it (never a RecursionError). Only a value whose text
    holds an escape of NUL or a surrogate is walked."""
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError("the JSON nests too deep to read") from None
    if _UNSTORABLE_ESCAPE.search(text):
        value = _untrusted_value(value)
    return value


def untrusted_json_text(raw: str) -> str:
    """A provider's JSON text as the service may relay it: unchanged, unless it holds an escape
    of NUL or a surrogate, when it is written again from ``untrusted_json`` (the same value,
    those characters replaced). Text that is not JSON is made safe as text."""
    if not _UNSTORABLE_ESCAPE.search(raw):
        return untrusted_text(raw)
    try:
        return json.dumps(untrusted_json(raw), ensure_ascii=False)
    except ValueError:
        return untrusted_text(raw)


def _untrusted_value(value: Any) -> Any:
    """``value`` with every string and key made safe; iterative, so any depth json.loads took."""
    if isinstance(value, str):
        return untrusted_text(value)
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            for index, child in enumerate(item):
                if isinstance(child, str):
                    item[index] = untrusted_text(child)
                elif isinstance(child, dict | list):
                    stack.append(child)
        elif isinstance(item, dict):
            for key in list(item):
                child = item[key]
                if isinstance(child, str):
                    child = untrusted_text(child)
                elif isinstance(child, dict | list):
                    stack.append(child)
                safe = untrusted_text(key)
                if safe != key:
                    del item[key]
                item[safe] = child
    return value
