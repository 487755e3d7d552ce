"""The client's errors, named as httpx names the same failures: a call's error message starts
with that name (``inference.calls.classify.classify_exception``)."""

from __future__ import annotations


class HttpError(Exception):
    """A failure below HTTP's answer: no answer, or not a whole one."""


class ConnectError(HttpError):
    """The connection (or its TLS handshake) failed: the request was not sent."""


class ConnectTimeout(HttpError):
    """No connection within the connect timeout: the request was not sent."""


class WriteError(HttpError):
    """The connection was lost while the request was written."""


class ReadError(HttpError):
    """The connection was lost (reset) while the answer was read."""


class RemoteProtocolError(HttpError):
    """The peer broke HTTP/1.1: an answer that does not parse, or one cut short by its close."""


class LocalProtocolError(HttpError):
    """The request cannot be written as HTTP/1.1 (a header name or value that would break it)."""
