"""The ``asgi_server`` fixture for browser tests that need websockets: uvicorn serving
``interfaces.asgi:application`` on the test database and this Redis, in its own process
(pytest-django's ``live_server`` is WSGI and serves no websocket)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.agentops import live_asgi


@pytest.fixture
def asgi_server(transactional_db: None) -> Iterator[str]:
    """Yields the base URL of a uvicorn serving the ASGI app."""
    yield from live_asgi.asgi_server("browser")
