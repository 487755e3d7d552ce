"""The provider layer's tests: a test's own event loop gets its own outbound session
(``agentops.outbound``), closed with the test so no session outlives its loop."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agentops.outbound import outbound_close


@pytest.fixture(autouse=True)
async def _outbound_closed() -> AsyncIterator[None]:
    yield
    await outbound_close()
