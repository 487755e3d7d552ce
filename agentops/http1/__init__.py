"""The HTTP/1.1 client of provider calls: a request written on one of asyncio's own transports,
its answer parsed by httptools (llhttp, in C).

A worker starts calls by the hundred a second and holds thousands of streams that mostly wait,
on the one loop that also times their cuts. Through httpx and httpcore a short non-streamed call
cost 1.1-1.2 ms of CPU here and a three-delta stream 3.3-4 ms, against 0.1 and 1.0 ms for the
same exchanges written on an asyncio protocol with httptools' parser (a micro-benchmark against
the stand-in, one process, one connection): the request and response models, the header
normalisation, the auth and redirect steps, h11's state machine per event and the pool's walk
over its connections at every request and close. Here a connection is one protocol object, an
answer one object fed by the parser's callbacks, and a pool a list of idle connections per
origin.

What it does: POST (or any method) with a body, ``Content-Length`` or chunked answers or an
answer read to the connection's end, keep-alive reuse (an idle connection the peer closed or
wrote to, or idle past ``KEEPALIVE_EXPIRY_S``, is not used again; a request that a reused
connection lost before any answer is sent once more on a new one), TLS verified against the
server name (``sni_hostname`` when the URL is the address the provider policy checked), a
connect timeout, gzip and deflate answers decoded (it asks for none), backpressure both ways.
What it does not: proxies (a call goes to the address its provider check resolved, as a
webhook does), redirects (a provider's answer is read as it is), HTTP/2, a read timeout (the
progress bounds decide how long a call may take).

The package: ``request`` writes a request, ``response`` reads an answer, ``connection`` is one
connection's protocol, ``client`` the pool and an exchange, ``errors`` what fails (named as
httpx names the same failures).
"""

from .client import Client
from .errors import (
    ConnectError,
    ConnectTimeout,
    HttpError,
    LocalProtocolError,
    ReadError,
    RemoteProtocolError,
    WriteError,
)
from .response import Response

__all__ = [
    "Client",
    "ConnectError",
    "ConnectTimeout",
    "HttpError",
    "LocalProtocolError",
    "ReadError",
    "RemoteProtocolError",
    "Response",
    "WriteError",
]
