"""Provider calls behind an outbound proxy (architecture.md §15): ``HTTPS_PROXY`` is honoured with a
CONNECT tunnel through a small proxy on loopback, TLS is verified end to end against the
provider's name, ``NO_PROXY`` and ``AGENTOPS_PROVIDER_PROXY_FROM_ENV=false`` send it direct."""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp.connector
import pytest
import trustme

from calls.adapters import OpenAIAdapter
from calls.bounds import BoundsSettings
from calls.client import CallResult
from calls.reading import perform_call
from calls.types import CompiledRequest, Message
from tests import hostile

BOUNDS = BoundsSettings(
    before_content_ms=5000,
    between_events_ms=5000,
    think_tokens_per_second=100,
    flat_minimum_ms=10_000,
    absolute_ms=20_000,
)


@dataclass
class ConnectProxy:
    """An HTTP proxy that only tunnels (CONNECT), as corporate proxies for HTTPS do."""

    port: int = 0
    tunnels: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # what the proxy's own DNS answers

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target = head.decode("latin-1").split(" ")[:2]
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n")
            writer.close()
            return
        self.tunnels.append(target)
        host, port = target.rsplit(":", 1)
        upstream_reader, upstream_writer = await asyncio.open_connection(
            self.names.get(host, host), int(port)
        )
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))


@pytest.fixture
async def tls_provider() -> AsyncIterator[int]:
    """The hostile provider's plain answers, over TLS with a certificate for ``localhost`` from
    a throwaway authority that the process's default TLS context is made to trust."""
    authority = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("localhost", "provider.invalid").configure_cert(server_tls)
    authority.configure_trust(
        aiohttp.connector._SSL_CONTEXT_VERIFIED
    )  # the client's default context
    server = await asyncio.start_server(hostile.handle, "127.0.0.1", 0, ssl=server_tls)
    yield server.sockets[0].getsockname()[1]
    server.close()


@pytest.fixture
async def proxy() -> AsyncIterator[ConnectProxy]:
    made = ConnectProxy()
    server = await asyncio.start_server(made.handle, "127.0.0.1", 0)
    made.port = server.sockets[0].getsockname()[1]
    yield made
    server.close()


async def call(port: int) -> CallResult:
    adapter = OpenAIAdapter()
    request = CompiledRequest(
        model="answer",
        system="",
        max_tokens=50,
        stream=True,
        messages=[Message(role="user", blocks=[{"type": "text", "text": "hi"}])],
    )
    wire = adapter.build(base_url=f"https://localhost:{port}/v1", api_key="", request=request)
    # As the provider policy leaves it: the name's checked address.
    wire = replace(wire, addresses=(ipaddress.ip_address("127.0.0.1"),))
    return await perform_call(
        adapter=adapter, wire=wire, streamed=True, max_tokens=50, bounds=BOUNDS
    )


async def test_a_call_goes_through_the_https_proxy_in_a_tunnel_verified_against_the_providers_name(
    monkeypatch: pytest.MonkeyPatch,
    tls_provider: int,
    proxy: ConnectProxy,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    result = await call(tls_provider)
    assert (
        result.outcome == "completed"
        and result.output is not None
        and result.output.text == "Hello there"
    ), result
    assert proxy.tunnels == [f"localhost:{tls_provider}"]


@pytest.mark.parametrize(
    "direct",
    [{"NO_PROXY": "localhost"}, {"AGENTOPS_PROVIDER_PROXY_FROM_ENV": "false"}],
    ids=["no_proxy", "setting-off"],
)
async def test_no_proxy_or_the_setting_sends_the_call_direct(
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    tls_provider: int,
    proxy: ConnectProxy,
    direct: dict[str, str],
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
    for name, value in direct.items():
        monkeypatch.setenv(name, value)
    settings.AGENTOPS_PROVIDER_PROXY_FROM_ENV = (
        direct.get("AGENTOPS_PROVIDER_PROXY_FROM_ENV") != "false"
    )
    result = await call(tls_provider)
    assert result.outcome == "completed", result
    assert proxy.tunnels == []


async def test_a_proxy_that_refuses_the_tunnel_is_a_network_error_saying_so(
    monkeypatch: pytest.MonkeyPatch, tls_provider: int
) -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(refuse, "127.0.0.1", 0)
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    result = await call(tls_provider)
    server.close()
    assert (
        result.error is not None
        and result.error.type == "network"
        and "proxy refused" in result.error.message
        and "407" in result.error.message
    )


@pytest.mark.django_db(
    transaction=True
)  # (its rows are written from another thread: flushed after)
async def test_a_provider_name_only_the_proxy_resolves_is_called_through_it(
    monkeypatch: pytest.MonkeyPatch,
    tls_provider: int,
    proxy: ConnectProxy,
) -> None:
    from asgiref.sync import sync_to_async

    from calls.gate import provider_vetted
    from tests.factories import AgentFactory, ProviderFactory

    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    proxy.names["provider.invalid"] = "127.0.0.1"  # .invalid never resolves here (RFC 6761)
    base_url = f"https://provider.invalid:{tls_provider}/v1"
    agent = await sync_to_async(AgentFactory.create)(
        provider=await sync_to_async(ProviderFactory.create)(
            name="behind-proxy", kind="openai", base_url=base_url
        )
    )
    adapter = OpenAIAdapter()
    request = CompiledRequest(
        model="answer",
        system="",
        max_tokens=50,
        stream=False,
        messages=[Message(role="user", blocks=[{"type": "text", "text": "hi"}])],
    )
    wire, refused = await sync_to_async(provider_vetted)(
        agent.provider, adapter.build(base_url=base_url, api_key="", request=request)
    )
    assert refused is None
    result = await perform_call(
        adapter=adapter, wire=wire, streamed=False, max_tokens=50, bounds=BOUNDS
    )
    assert result.outcome == "completed", result
    assert proxy.tunnels == [f"provider.invalid:{tls_provider}"]
