"""The stand-in provider over real sockets, parsed by the official SDKs where they apply.

Plain pytest: no Django, no database. The server is a real subprocess
(``python -m devtools.standin --port 0``) shared by the package's tests.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest

from devtools.standin.process import StandinProcess


@pytest.fixture(scope="package")
def server() -> Iterator[StandinProcess]:
    process = StandinProcess()
    process.start()
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="package")
def base(server: StandinProcess) -> str:
    return server.base_url


@pytest.fixture(scope="package")
def oai(server: StandinProcess) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(
        base_url=server.openai_base_url, api_key="sk-test", max_retries=0, timeout=10
    )
    yield client
    client.close()


@pytest.fixture(scope="package")
def ant(server: StandinProcess) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(
        base_url=server.anthropic_base_url, api_key="sk-ant-test", max_retries=0, timeout=10
    )
    yield client
    client.close()


@pytest.fixture(scope="package")
def http(base: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, timeout=10) as client:
        yield client
