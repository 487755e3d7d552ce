"""The benches run under pytest (``make bench``'s second part) build the process's runtime as
the tests' session does: what they write may send live events."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentops.runtime import serving
from turns.runtime import TurnRuntime


@pytest.fixture(scope="session", autouse=True)
def runtime() -> Iterator[TurnRuntime]:
    with serving(TurnRuntime(worker=False)) as made:
        yield made
