"""The shared-quota provider (``tests.quota``) for the capacity and pool tests."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from agentops.models import Provider
from tests.conftest import server_process
from tests.factories import ProviderFactory


@pytest.fixture(scope="session")
def quota() -> Iterator[str]:
    """The shared-quota provider in its own process. Yields its base URL."""
    yield from server_process("tests.quota", "quota", "--port", "0")


Scenario = Callable[..., tuple[Provider, Callable[[], list[dict[str, Any]]]]]


@pytest.fixture
def scenario(quota: str) -> Scenario:
    """A provider on a fresh scenario of the quota server (its own counters), and a reader of
    the requests it received."""

    def make(
        *, kind: str = "openai", **config: Any
    ) -> tuple[Provider, Callable[[], list[dict[str, Any]]]]:
        name = f"q{uuid.uuid4().hex[:10]}"
        httpx.post(f"{quota}/_quota/config", json={"scenario": name, **config}).raise_for_status()
        base = f"{quota}/{name}/v1" if kind == "openai" else f"{quota}/{name}"
        provider = ProviderFactory.create(name=name, kind=kind, base_url=base)

        def requests() -> list[dict[str, Any]]:
            return [r for r in httpx.get(f"{quota}/_quota/log").json() if r["scenario"] == name]

        return provider, requests

    return make
