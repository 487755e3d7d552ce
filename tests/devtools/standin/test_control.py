"""Scenario parsing, the request record, unknown routes and clean shutdown."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import httpx
import openai
import pytest

from devtools.standin.process import StandinProcess
from tests.conftest import wait_for
from tests.devtools.standin.common import ANSWER, APIS, USER, error_object, path_of, request_body

pytestmark = [pytest.mark.timeout(60)]


# --------------------------------------------------------------------------- #
# Scenario selection and the request record
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("api", APIS)
def test_bad_scenarios_are_400_naming_the_problem(http: httpx.Client, api: str) -> None:
    for model, needle in [
        ("no-such-thing", "'no-such-thing'"),
        ("answer:chunks=zero", "'chunks'"),
        ("answer:colour=blue", "'colour'"),
        ("error:form=sideways", "'form'"),
        ("answer:chunks", "'chunks'"),
    ]:
        resp = http.post(path_of(api), json=request_body(model))
        assert resp.status_code == 400, model
        error = error_object(api, resp.json())
        assert error["type"] == "invalid_request_error"
        assert needle in error["message"], (model, error["message"])


def test_requests_are_recorded(http: httpx.Client, oai: openai.OpenAI) -> None:
    assert http.delete("/_standin/requests").json() == {"ok": True}
    before = time.time()
    completion = oai.chat.completions.create(
        model="gpt-4o",
        messages=USER,
        extra_headers={"X-Standin-Scenario": "answer:text=from%20header", "X-Trace": "t-1"},
    )
    assert completion.choices[0].message.content == "from header"
    assert completion.model == "gpt-4o"
    http.post(path_of("anthropic"), json=request_body("auth", stream=True))
    http.post(path_of("anthropic"), content=b"{not json")
    records = http.get("/_standin/requests").json()
    assert [r["path"] for r in records] == [
        path_of("openai"),
        path_of("anthropic"),
        path_of("anthropic"),
    ]
    first, second, third = records
    assert first["model"] == "gpt-4o"
    assert first["scenario"] == "answer:text=from%20header"
    assert first["stream"] is False
    assert first["body"] == {"model": "gpt-4o", "messages": USER}
    assert first["headers"]["x-trace"] == "t-1"
    assert first["headers"]["authorization"] == "Bearer sk-test"
    assert before - 1 <= first["received_at"] <= time.time() + 1
    assert second["scenario"] == "auth" and second["stream"] is True
    assert second["body"] == request_body("auth", stream=True)
    assert third["body"] == "{not json" and third["model"] is None


def test_unknown_paths_and_methods(http: httpx.Client) -> None:
    assert http.post("/v1/embeddings", json={}).status_code == 404
    assert http.get("/v1/messages").status_code == 405
    assert http.get("/_standin/nope").status_code == 404
    resp = http.post("/chat/completions", json=request_body("answer"))
    assert resp.json()["choices"][0]["message"]["content"] == ANSWER


# --------------------------------------------------------------------------- #
# Process lifecycle
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_exits_cleanly_with_open_requests(sig: signal.Signals) -> None:
    standin = StandinProcess()
    standin.start()
    results: list[Any] = []

    def hang() -> None:
        try:
            results.append(
                httpx.post(standin.base_url + "/v1/messages", json=request_body("hang"), timeout=10)
            )
        except httpx.HTTPError as exc:
            results.append(exc)

    thread = threading.Thread(target=hang)
    thread.start()
    with httpx.stream(
        "POST",
        standin.base_url + "/v1/chat/completions",
        json=request_body("endless", stream=True),
        timeout=10,
    ) as resp:
        lines = resp.iter_lines()
        next(lines)
        process = standin.process
        assert process is not None
        wait_for(
            lambda: httpx.get(standin.base_url + "/_standin/open").json() == {"open": 2},
            timeout=5,
            what="the hanging request and the stream both open at the stand-in",
        )
        start = time.monotonic()
        process.send_signal(sig)
        for _ in lines:  # the stream ends instead of running forever
            pass
        assert process.wait(timeout=5) == 0
        assert time.monotonic() - start < 3
    thread.join(timeout=5)
    assert results and isinstance(results[0], httpx.Response) and results[0].status_code == 503
    assert standin.stop() == 0
