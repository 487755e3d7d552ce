"""The API during a PostgreSQL outage (issue 12, test 4): a fast 503 a client can tell from a
bug."""

from __future__ import annotations

import time

import httpx

from tests.conftest import wait_for

from .conftest import FaultStack, submit

PROMPT_S = 2.0


def test_during_a_postgres_outage_the_api_answers_503_within_two_seconds_with_retry_after(
    faults: FaultStack,
) -> None:
    turn = submit(faults, "outage-four", "answer")
    faults.stop_postgres()
    requests = [
        ("GET", f"/turns/{turn}", None),
        ("GET", "/agents/outage-four", None),
        (
            "POST",
            "/agents/outage-four/turns",
            {"messages": [{"participant": "alice", "content": "Hi"}]},
        ),
        ("GET", "/waits", None),
    ]
    for method, path, body in requests:
        started = time.monotonic()
        answer = faults.api(method, path, body, timeout=15)
        took = time.monotonic() - started
        assert answer.status_code == 503, (method, path, answer.status_code, answer.text)
        print(f"measure 4: {method} {path} answered {answer.status_code} in {took:.2f} s")
        assert took < PROMPT_S, (method, path, took)
        assert answer.json()["code"] == "unavailable"
        assert int(answer.headers["Retry-After"]) > 0
    health = httpx.get(f"{faults.web_url}/api/v1/health", timeout=15)
    assert health.status_code == 200
    assert health.json()["status"] == "degraded" and health.json()["database"] is False
    faults.start_postgres()
    back = wait_for(
        lambda: faults.api("GET", f"/turns/{turn}").status_code == 200,
        timeout=10,
        what="the API to answer again",
    )
    assert back


def test_during_a_redis_outage_a_submit_answers_503_within_two_seconds_and_reads_still_answer(
    faults: FaultStack,
) -> None:
    turn = submit(faults, "outage-four-redis", "answer")
    faults.stop_redis()
    started = time.monotonic()
    answer = faults.api(
        "POST",
        "/agents/outage-four-redis/turns",
        {"messages": [{"participant": "alice", "content": "Hi"}]},
        timeout=15,
    )
    took = time.monotonic() - started
    print(f"measure 4: POST a turn with Redis down answered {answer.status_code} in {took:.2f} s")
    assert answer.status_code == 503, answer.text
    assert took < PROMPT_S
    assert answer.json()["code"] == "unavailable" and int(answer.headers["Retry-After"]) > 0
    assert faults.api("GET", f"/turns/{turn}").status_code == 200  # reads need only the database
    health = httpx.get(f"{faults.web_url}/api/v1/health", timeout=15)
    assert (
        health.status_code == 200
        and health.json()["status"] == "degraded"
        and health.json()["redis"] is False
    )
