"""The background loop's HTTP connections on asyncio's own transports (``agentops.sockets``),
against real servers on loopback: plain and TLS streams, keep-alive reuse and a peer that closed
an idle connection, the timeouts, a refused connect, a peer gone mid-stream, a body larger
than the socket's buffers."""

from __future__ import annotations

import asyncio
import gc
import socket
import ssl
from collections.abc import Awaitable, Callable

import httpcore
import httpx
import pytest
import trustme

from agentops.sockets import AsyncioBackend, AsyncioStream, asyncio_transport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=8)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
    return await reader.readexactly(length)


def sse_answer(lines: list[bytes]) -> bytes:
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(line), line) for line in lines)
    return b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


async def serve(handler: Handler, tls: ssl.SSLContext | None = None) -> tuple[asyncio.Server, int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=tls)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
def authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls(authority: trustme.CA) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server's TLS for provider.test, and a client's that trusts it."""
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("provider.test").configure_cert(server_tls)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)
    return server_tls, trusting


def answering(line: bytes, *, close: bool = False) -> Handler:
    """A handler that reads one request and answers a stream of ``line`` (then closes)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(sse_answer([line]))
        await writer.drain()
        if close:
            writer.close()

    return handler


def client(verify: ssl.SSLContext | None = None, timeout: httpx.Timeout | None = None) -> httpx.AsyncClient:
    transport = asyncio_transport(verify=verify or ssl.create_default_context(), limits=LIMITS)
    return httpx.AsyncClient(transport=transport, timeout=timeout or httpx.Timeout(5))


async def test_a_stream_arrives_line_by_line_on_an_asyncio_stream_and_the_next_request_reuses_it() -> None:
    served: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(id(writer))
        for _ in range(2):
            await read_request(reader)
            writer.write(sse_answer([b": keepalive\n\n", b"data: one\n\n", b"data: two\n\n"]))
            await writer.drain()

    server, port = await serve(handler)
    async with server, client() as http:
        streams = []
        for _ in range(2):
            async with http.stream("POST", f"http://127.0.0.1:{port}/v1", json={"a": 1}) as resp:
                streams.append(resp.extensions["network_stream"])
                lines = [line async for line in resp.aiter_lines()]
            assert lines == [": keepalive", "", "data: one", "", "data: two", ""]
        assert isinstance(streams[0], AsyncioStream) and streams[1] is streams[0]
        assert len(served) == 1


async def test_a_connect_to_an_address_is_not_raced_and_a_name_still_connects() -> None:
    # A listener that never accepts: the kernel completes the connects, no server objects here.
    listener = socket.create_server(("127.0.0.1", 0), backlog=64)
    port = listener.getsockname()[1]
    backend = AsyncioBackend()
    try:
        await (await backend.connect_tcp("127.0.0.1", port, timeout=5)).aclose()  # first uses
        gc.collect()
        gc.disable()
        try:
            for _ in range(20):
                await (await backend.connect_tcp("127.0.0.1", port, timeout=5)).aclose()
            await asyncio.sleep(0.05)  # the transports' close callbacks
            # asyncio's happy-eyeballs race left each connect's tasks, events and cancellations
            # in cycles (about 50 objects); a closed transport leaves none (the test below).
            assert gc.collect() < 20
        finally:
            gc.enable()
        # A name (a call is sent to its checked address, not a name) is raced as anyio does.
        await (await backend.connect_tcp("localhost", port, timeout=5)).aclose()
    finally:
        listener.close()


async def test_a_connection_the_peer_closed_while_idle_is_not_used_again() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # no keep-alive announced: the client finds out when it looks

    server, port = await serve(handler)
    async with server, client() as http:
        first = await http.get(f"http://127.0.0.1:{port}/")
        await asyncio.sleep(0.1)
        second = await http.get(f"http://127.0.0.1:{port}/")
        assert (first.text, second.text) == ("ok", "ok")
        assert second.extensions["network_stream"] is not first.extensions["network_stream"]


async def test_tls_verifies_the_certificate_against_the_name_and_streams_over_it(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_tls, trusting = tls
    handler = answering(b"data: secret\n\n")

    server, port = await serve(handler, server_tls)
    async with server, client(trusting) as http:
        url = f"https://127.0.0.1:{port}/v1"
        async with http.stream("POST", url, json={}, extensions={"sni_hostname": "provider.test"}) as resp:
            assert [line async for line in resp.aiter_lines()] == ["data: secret", ""]
            assert resp.extensions["network_stream"].get_extra_info("ssl_object").server_hostname == "provider.test"
    server, port = await serve(handler, server_tls)
    async with server, client(trusting) as http:  # (a new client: the pool keys connections by address)
        with pytest.raises(httpx.ConnectError, match="certificate"):
            await http.post(f"https://127.0.0.1:{port}/v1", json={}, extensions={"sni_hostname": "other.test"})
    async with client() as untrusting:  # the system's trust store does not know the test authority
        server, port = await serve(handler, server_tls)
        async with server:
            with pytest.raises(httpx.ConnectError, match="certificate"):
                await untrusting.post(f"https://127.0.0.1:{port}/v1", json={}, extensions={"sni_hostname": "provider.test"})


async def test_a_closed_connection_plain_or_tls_leaves_no_transport_for_the_collector(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_tls, trusting = tls
    handler = answering(b"data: done\n\n", close=True)

    for server_side, scheme in ((None, "http"), (server_tls, "https")):
        server, port = await serve(handler, server_side)
        # httpcore's pool on this backend, without httpx's response (which binds its stream in a
        # cycle of its own: ``inference.calls.client`` unbinds it).
        async with server, httpcore.AsyncConnectionPool(ssl_context=trusting, network_backend=AsyncioBackend()) as pool:
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)
            try:
                for _ in range(5):
                    resp = await pool.request("POST", f"{scheme}://127.0.0.1:{port}/v1", content=b"{}", extensions={"sni_hostname": "provider.test"})
                    assert resp.status == 200 and b"data: done" in resp.content
                await asyncio.sleep(0.1)  # the peer's close reaches this side
                gc.collect()
                # This side's socket transports (their peer is the server's port); the server's
                # are asyncio's streams', not ours.
                ours = [o for o in gc.garbage if isinstance(o, asyncio.Transport) and (o.get_extra_info("peername") or ("", 0))[1] == port]
            finally:
                gc.set_debug(0)
                gc.garbage.clear()
        assert ours == [], (scheme, ours)


async def test_a_silent_peer_times_the_read_out_and_a_refused_connect_is_a_connect_error() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(10)

    server, port = await serve(silent)
    async with server, client(timeout=httpx.Timeout(5, read=0.2)) as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.get(f"http://127.0.0.1:{port}/")
    async with client() as http:
        with pytest.raises(httpx.ConnectError):
            await http.get(f"http://127.0.0.1:{port}/")  # the server is closed now


async def test_a_peer_gone_mid_stream_ends_the_read_with_an_error_after_what_it_sent() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(sse_answer([b"data: one\n\n"])[:-5])  # no last chunk
        await writer.drain()
        writer.close()

    server, port = await serve(handler)
    got: list[str] = []
    async with server, client() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            async with http.stream("GET", f"http://127.0.0.1:{port}/") as resp:
                async for line in resp.aiter_lines():
                    got.append(line)
    assert got[:1] == ["data: one"]


async def test_a_body_larger_than_the_socket_buffers_is_written_whole_to_a_slow_reader() -> None:
    body = bytes(range(256)) * (16 * 1024)  # 4 MiB
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
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()

    server, port = await serve(slow)
    async with server, client() as http:
        assert (await http.post(f"http://127.0.0.1:{port}/", content=body)).status_code == 200
    assert received == [body]



async def test_an_answer_larger_than_the_read_buffer_reaches_a_slow_reader_whole() -> None:
    body = bytes(range(256)) * (8 * 1024)  # 2 MiB: the socket is paused and resumed on the way

    async def fast(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        await writer.drain()

    server, port = await serve(fast)
    got = bytearray()
    async with server, client() as http:
        async with http.stream("GET", f"http://127.0.0.1:{port}/") as resp:
            async for chunk in resp.aiter_raw():
                got += chunk
                await asyncio.sleep(0.002)
    assert bytes(got) == body
