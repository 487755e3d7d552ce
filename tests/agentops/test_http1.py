"""The provider calls' HTTP/1.1 client (``agentops.http1``) against real servers on loopback:
answers framed by length, by chunks and by the connection's end; lines split as server-sent
events are; keep-alive reuse and what is not reused; TLS verified against the server name; the
connect's errors and timeout; a peer gone mid-answer; bodies larger than the socket's buffers
both ways; a compressed answer; a header that would break the request."""

from __future__ import annotations

import asyncio
import gc
import gzip
import socket
import ssl
from collections.abc import Awaitable, Callable

import pytest
import trustme

from agentops import http1
from agentops.http1.connection import Connection

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (its Content-Length's worth)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    return head, await reader.readexactly(length)


def chunked(parts: list[bytes], *, status: bytes = b"200 OK", headers: bytes = b"content-type: text/event-stream\r\n") -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts)
    return b"HTTP/1.1 " + status + b"\r\n" + headers + b"transfer-encoding: chunked\r\n\r\n" + body + b"0\r\n\r\n"


async def serve(handler: Handler, tls: ssl.SSLContext | None = None) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=tls)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
def tls() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server's TLS for provider.test, and a client's that trusts it."""
    authority = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("provider.test").configure_cert(server_tls)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    return server_tls, trusting


def answering(answer: bytes, *, close: bool = False) -> Handler:
    """A handler that answers every request on its connection with ``answer`` (then closes)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(answer)
            await writer.drain()
            if close:
                writer.close()
                return

    return handler


async def test_a_request_goes_as_http_1_1_and_its_answer_is_read_by_length_then_the_connection_is_reused() -> None:
    requests: list[tuple[bytes, bytes]] = []
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(id(writer))
        for _ in range(2):
            requests.append(await read_request(reader))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Twice: a\r\nx-twice: b\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
            await writer.drain()

    server, port = await serve(handler)
    async with server, http1.Client() as http:
        for _ in range(2):
            async with http.stream("POST", f"http://127.0.0.1:{port}/v1/chat?x=1", json={"a": "é"}, headers={"Authorization": "Bearer k"}) as resp:
                assert resp.status_code == 200
                assert resp.headers["content-type"] == "application/json" and resp.headers["x-twice"] == "a, b"
                assert await resp.aread() == b'{"ok":true}'
    assert len(connections) == 1  # the second request went on the kept connection
    head, body = requests[0]
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/chat?x=1 HTTP/1.1"
    assert {f"host: 127.0.0.1:{port}", "Authorization: Bearer k", "content-type: application/json", "accept-encoding: identity", "content-length: 10"} <= set(lines)
    assert body == '{"a":"é"}'.encode()


async def test_a_chunked_stream_arrives_as_lines_split_where_server_sent_events_split() -> None:
    # Line ends of all three kinds, a CRLF and a UTF-8 character split across chunks.
    euro = "€".encode()
    parts = [b": keepalive\r", b"\ndata: one\n\n", b"data: tw", b"o\r\rdata: " + euro[:1], euro[1:] + b"\r\n\r\n", b"data: last"]
    server, port = await serve(answering(chunked(parts)))
    async with server, http1.Client() as http, http.stream("POST", f"http://127.0.0.1:{port}/", json={}) as resp:
        lines = [line async for line in resp.aiter_lines()]
    assert lines == [": keepalive", "data: one", "", "data: two", "", "data: €", "", "data: last"]


async def test_an_answer_read_to_the_connections_end_is_whole_and_its_connection_not_kept() -> None:
    served: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(1)
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it")
        await writer.drain()
        writer.close()

    server, port = await serve(handler)
    async with server, http1.Client() as http:
        for _ in range(2):
            async with http.stream("GET", f"http://127.0.0.1:{port}/") as resp:
                assert await resp.aread() == b"all of it"
    assert len(served) == 2


async def test_an_idle_connection_the_peer_closed_is_not_used_again_and_one_lost_as_the_request_went_is_sent_again() -> None:
    served: list[int] = []

    async def closing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(1)
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # no "connection: close" announced: the client finds out when it looks

    server, port = await serve(closing)
    async with server, http1.Client() as http:
        for _ in range(3):
            async with http.stream("GET", f"http://127.0.0.1:{port}/") as resp:
                assert await resp.aread() == b"ok"
            await asyncio.sleep(0.05)
    assert len(served) == 3

    # A server that drops a kept connection just as the next request goes out (it never reads
    # it): the request goes once more on a new connection.
    dropped: list[int] = []

    async def drops_the_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")
        dropped.append(1)
        writer.transport.abort()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not dropped:
            await drops_the_second(reader, writer)
        else:
            await answering(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nagain")(reader, writer)

    server, port = await serve(handler)
    async with server, http1.Client() as http:
        async with http.stream("POST", f"http://127.0.0.1:{port}/", json={}) as resp:
            assert await resp.aread() == b"ok"
        async with http.stream("POST", f"http://127.0.0.1:{port}/", json={}) as resp:
            assert await resp.aread() == b"again"
    assert dropped == [1]


async def test_an_answer_not_read_to_its_end_closes_its_connection() -> None:
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while True:
            try:
                await read_request(reader)
            except asyncio.IncompleteReadError:
                return
            answer = chunked([b"data: one\n\n", b"data: two\n\n"])
            writer.write(answer[:-20])
            await writer.drain()
            await asyncio.sleep(0.2)  # the rest comes after the reader has gone
            writer.write(answer[-20:])
            await writer.drain()

    server, port = await serve(handler)
    async with server, http1.Client() as http:
        for _ in range(2):
            async with http.stream("POST", f"http://127.0.0.1:{port}/", json={}) as resp:
                async for _line in resp.aiter_lines():
                    break  # a cut: the rest is not read
    assert len(connections) == 2


async def test_tls_verifies_the_certificate_against_the_server_name(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_tls, trusting = tls
    server, port = await serve(answering(chunked([b"data: secret\n\n"])), server_tls)
    async with server:
        async with http1.Client(tls=trusting) as http, http.stream("POST", f"https://127.0.0.1:{port}/v1", json={}, sni_hostname="provider.test") as resp:
            assert [line async for line in resp.aiter_lines()] == ["data: secret", ""]
        async with http1.Client(tls=trusting) as http:
            with pytest.raises(http1.ConnectError, match="certificate"):
                async with http.stream("POST", f"https://127.0.0.1:{port}/v1", json={}, sni_hostname="other.test"):
                    pass
        async with http1.Client() as untrusting:  # the system's trust store does not know the test authority
            with pytest.raises(http1.ConnectError, match="certificate"):
                async with untrusting.stream("POST", f"https://127.0.0.1:{port}/v1", json={}, sni_hostname="provider.test"):
                    pass


async def test_a_refused_connect_is_a_connect_error_and_a_handshake_that_never_ends_a_connect_timeout() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    async with http1.Client() as http:
        with pytest.raises(http1.ConnectError):
            async with http.stream("GET", f"http://127.0.0.1:{port}/"):
                pass

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)  # accepts the connection, never answers the TLS hello

    server, port = await serve(silent)
    async with server, http1.Client(connect_timeout_s=0.3) as http:
        with pytest.raises(http1.ConnectTimeout):
            async with http.stream("GET", f"https://127.0.0.1:{port}/", sni_hostname="provider.test"):
                pass


async def test_a_peer_gone_mid_answer_ends_the_read_with_an_error_after_what_it_sent() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(chunked([b"data: one\n\n"])[:-5])  # no last chunk
        await writer.drain()
        writer.close()

    server, port = await serve(handler)
    got: list[str] = []
    async with server, http1.Client() as http:
        with pytest.raises(http1.RemoteProtocolError, match="before its answer's end"):
            async with http.stream("POST", f"http://127.0.0.1:{port}/", json={}) as resp:
                async for line in resp.aiter_lines():
                    got.append(line)
    assert got[:1] == ["data: one"]


async def test_a_body_larger_than_the_socket_buffers_goes_whole_to_a_slow_reader_and_comes_whole_to_one() -> None:
    body = bytes(range(256)) * (16 * 1024)  # 4 MiB: writing waits for the peer to drain it
    received: list[bytes] = []

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")))
        chunks = []
        while length:
            await asyncio.sleep(0.001)
            chunk = await reader.read(min(length, 64 * 1024))
            chunks.append(chunk)
            length -= len(chunk)
        received.append(b"".join(chunks))
        # And as much back, which the client reads slowly: its socket is paused and resumed.
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    server, port = await serve(slow)
    got = bytearray()
    async with server, http1.Client() as http, http.stream("POST", f"http://127.0.0.1:{port}/", content=body) as resp:
        async for chunk in resp.aiter_bytes():
            got += chunk
            await asyncio.sleep(0.002)
    assert received == [body]
    assert bytes(got) == body


async def test_a_gzip_answer_is_decoded_and_an_unknown_coding_refused() -> None:
    text = b'{"answer": "' + b"x" * 5000 + b'"}'
    packed = gzip.compress(text)
    server, port = await serve(answering(b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(packed) + packed))
    async with server, http1.Client() as http, http.stream("POST", f"http://127.0.0.1:{port}/", json={}) as resp:
        assert await resp.aread() == text
    server, port = await serve(answering(b"HTTP/1.1 200 OK\r\ncontent-encoding: br\r\ncontent-length: 3\r\n\r\nabc"))
    async with server, http1.Client() as http:
        with pytest.raises(http1.RemoteProtocolError, match="content-encoding 'br'"):
            async with http.stream("POST", f"http://127.0.0.1:{port}/", json={}) as resp:
                await resp.aread()


@pytest.mark.parametrize("name, value", [("X-Evil", "a\r\nInjected: yes"), ("X-Evil", "a\nb"), ("Bad Name", "x"), ("X-Nul", "a\x00b")])
async def test_a_header_that_would_break_the_request_is_refused_before_anything_is_sent(name: str, value: str) -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.read(100))

    server, port = await serve(handler)
    async with server, http1.Client() as http:
        with pytest.raises(http1.LocalProtocolError, match="cannot be sent"):
            async with http.stream("POST", f"http://127.0.0.1:{port}/", json={}, headers={name: value}):
                pass
        await asyncio.sleep(0.05)
    assert seen == []


async def test_a_closed_connection_plain_or_tls_leaves_nothing_for_the_collector(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_tls, trusting = tls
    for server_side, scheme in ((None, "http"), (server_tls, "https")):
        server, port = await serve(answering(chunked([b"data: done\n\n"]), close=True), server_side)
        async with server, http1.Client(tls=trusting) as http:
            async with http.stream("POST", f"{scheme}://127.0.0.1:{port}/v1", json={}, sni_hostname="provider.test") as resp:
                await resp.aread()  # first use: imports, the TLS context
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                for _ in range(5):
                    async with http.stream("POST", f"{scheme}://127.0.0.1:{port}/v1", json={}, sni_hostname="provider.test") as resp:
                        assert b"data: done" in await resp.aread()
                await asyncio.sleep(0.1)  # the peer's close reaches this side
                gc.collect()
                # This side's objects: its transports (their peer is the server's port; the
                # server's are asyncio's streams', not ours), connections and answers.
                ours = [
                    o for o in gc.garbage
                    if isinstance(o, http1.Response | Connection)
                    or (isinstance(o, asyncio.Transport) and (o.get_extra_info("peername") or ("", 0))[1] == port)
                ]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
        # A connection, its answer and its parser hold each other only while they are in use; a
        # closed socket transport keeps a bound method of its own (cleared at its close).
        assert ours == [], (scheme, ours)


def test_the_client_runs_on_uvloops_loop_as_the_web_app_runs_it(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """uvicorn runs the web app (the drop-in and ``complete`` calls) on uvloop, whose transports
    are not asyncio's and whose connect takes no race delay."""
    import uvloop

    server_tls, trusting = tls

    async def main() -> list[object]:
        seen: list[object] = []
        for server_side, scheme in ((None, "http"), (server_tls, "https")):
            server, port = await serve(answering(chunked([b"data: one\n\n"])), server_side)
            async with server, http1.Client(tls=trusting) as http:
                for _ in range(2):  # the second on the kept connection
                    async with http.stream("POST", f"{scheme}://127.0.0.1:{port}/", json={}, sni_hostname="provider.test") as resp:
                        seen.append([line async for line in resp.aiter_lines()])
        server, port = await serve(answering(b"HTTP/1.1 204 No Content\r\n\r\n"))
        async with server, http1.Client() as http, http.stream("POST", f"http://localhost:{port}/", json={}) as resp:
            seen.append(resp.status_code)  # a name, not an address
        return seen

    assert uvloop.run(main()) == [["data: one", ""]] * 4 + [204]
