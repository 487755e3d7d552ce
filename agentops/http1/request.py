"""Writing a request: where it goes, and its head (the request line and headers)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from .errors import LocalProtocolError

USER_AGENT: Final = "agentops"
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_VALUE = re.compile(r"[\r\n\x00]")


class Target:
    """Where a request goes: the origin (the pool's key), the address to connect to, the
    request target and the Host header."""

    __slots__ = ("authority", "host", "key", "path", "port", "server_hostname", "tls")

    def __init__(self, url: str, sni_hostname: str | None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise LocalProtocolError(f"not an http(s) URL: {url!r}")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.authority = parts.netloc.rpartition("@")[2]
        self.path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.server_hostname = (sni_hostname or self.host) if self.tls else None
        self.key = (self.tls, self.host, self.port, self.server_hostname)


def request_head(method: str, target: Target, headers: Mapping[str, str], length: int, json_body: bool) -> bytes:
    """The request line and headers. A name that is not a token, or a value with a line break
    or a NUL, is refused (it would let a header end the request early, or inject one)."""
    lines = [f"{method} {target.path} HTTP/1.1"]
    given = {name.lower() for name in headers}
    if "host" not in given:
        lines.append(f"host: {target.authority}")
    for name, value in headers.items():
        if not _TOKEN.fullmatch(name) or _BAD_VALUE.search(value):
            raise LocalProtocolError(f"the request header {name!r} cannot be sent as HTTP/1.1")
        if name.lower() in ("content-length", "transfer-encoding", "connection"):
            continue  # this client frames the body and keeps the connection
        lines.append(f"{name}: {value}")
    if "user-agent" not in given:
        lines.append(f"user-agent: {USER_AGENT}")
    if "accept-encoding" not in given:
        lines.append("accept-encoding: identity")
    if json_body and "content-type" not in given:
        lines.append("content-type: application/json")
    lines.append(f"content-length: {length}")
    try:
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(f"a request header is not latin-1 text: {exc}") from None


def json_bytes(value: Any) -> bytes:
    # As httpx encodes a ``json=`` body.
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
