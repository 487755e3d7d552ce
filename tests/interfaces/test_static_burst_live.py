"""A browser's burst of static files against the real ASGI app under uvicorn (issue 47, item
1): a page load opens a few keep-alive connections and asks each for one file after another.
Before, the second static file on a connection answered 500 ("CurrentThreadExecutor already quit
or is broken"): the first one's thread executor leaked into the next request's context."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.agentops.live_asgi import asgi_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

FILES = [
    "admin/css/base.css",
    "admin/css/login.css",
    "admin/js/actions.js",
    "admin/js/core.js",
    "admin/js/SelectBox.js",
    "admin/js/SelectFilter2.js",
    "admin/js/nav_sidebar.js",
    "admin/js/theme.js",
    "admin/js/urlify.js",
    "admin/img/icon-addlink.svg",
    "admin/js/vendor/xregexp/xregexp.min.js",
    "admin/js/vendor/jquery/jquery.js",
    "agentops/dashboard.js",
]
CONNECTIONS = 60  # at once: a browser opens six a host, so ten pages loading together
ROUNDS = 3


@pytest.fixture(scope="module")
def web(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    yield from asgi_server("static-burst")


def page_load(web: str) -> list[tuple[str, int]]:
    """One keep-alive connection: the admin's login page, then its files one after another."""
    statuses = []
    with httpx.Client(base_url=web, timeout=30) as client:
        statuses.append(("/admin/login/", client.get("/admin/login/").status_code))
        for name in FILES:
            statuses.append((name, client.get(f"/static/{name}").status_code))
    return statuses


def pipelined(web: str) -> list[int]:
    """Every file asked for in one write on one connection; the statuses in order."""
    host, port = web.removeprefix("http://").split(":")
    asks = b"".join(f"GET /static/{n} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for n in FILES)
    received = b""
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(asks)
        while received.count(b"HTTP/1.1 ") < len(FILES):
            data = sock.recv(1 << 16)
            if not data:
                break
            received += data
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", received)]


def test_a_browser_burst_of_static_files_answers_every_file(web: str) -> None:
    for _ in range(ROUNDS):
        with ThreadPoolExecutor(CONNECTIONS) as pool:
            loads = list(pool.map(lambda _: page_load(web), range(CONNECTIONS)))
        failed = [(name, status) for load in loads for name, status in load if status != 200]
        assert not failed, f"{len(failed)} of {CONNECTIONS * (len(FILES) + 1)}: {failed[:5]}"


def test_pipelined_static_requests_on_one_connection_all_answer(web: str) -> None:
    for _ in range(ROUNDS):
        with ThreadPoolExecutor(CONNECTIONS) as pool:
            answers = list(pool.map(lambda _: pipelined(web), range(CONNECTIONS)))
        assert all(statuses == [200] * len(FILES) for statuses in answers), answers[:3]
