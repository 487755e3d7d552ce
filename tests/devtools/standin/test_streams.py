"""Keepalive-only, silent, trickling and endless streams: what the progress bounds are tested
against."""

from __future__ import annotations

import json
import time

import anthropic
import httpx
import openai
import pytest

from tests.devtools.standin.common import (
    ANSWER,
    APIS,
    SSE,
    USER,
    anthropic_text,
    assert_all_closed,
    openai_stream_text,
    parse_sse,
    path_of,
    read_raw_stream,
    request_body,
)

pytestmark = [pytest.mark.timeout(60)]


# --------------------------------------------------------------------------- #
# Keepalives, silence, hangs, trickles
# --------------------------------------------------------------------------- #


def is_keepalive(api: str, scenario: str, frame: SSE) -> bool:
    if scenario == "comments":
        return frame.comments == ["keepalive"] and frame.data is None
    if api == "anthropic":
        if scenario == "pings":
            return frame.event == "ping"
        body = frame.json()
        empty = {"type": "text_delta", "text": ""}
        return bool(body["type"] == "content_block_delta" and body["delta"] == empty)
    body = frame.json()
    if scenario == "pings":
        return bool(body["choices"] == [] and "usage" in body)
    return bool(body["choices"][0]["delta"] == {"content": ""})


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("scenario", ["pings", "comments", "empty-deltas"])
def test_keepalive_scenarios_send_only_keepalives(base: str, api: str, scenario: str) -> None:
    resp, raw, _ = read_raw_stream(base, api, f"{scenario}:interval_ms=40", 0.3)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/event-stream")
    frames = parse_sse(raw)
    first = frames.pop(0).json()
    if api == "openai":
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    else:
        assert first["type"] == "message_start"
        if scenario == "empty-deltas":
            start = frames.pop(0)
            assert start.event == "content_block_start"
            assert start.json()["content_block"] == {"type": "text", "text": ""}
    assert len(frames) >= 4
    assert all(is_keepalive(api, scenario, f) for f in frames)


@pytest.mark.parametrize("scenario", ["pings", "comments", "empty-deltas"])
def test_keepalive_scenarios_end_with_an_answer(
    oai: openai.OpenAI, ant: anthropic.Anthropic, scenario: str
) -> None:
    model = f"{scenario}:interval_ms=20,duration_ms=100"
    text, tail = openai_stream_text(oai, model)
    assert text == ANSWER and tail.endswith("|stop")
    with ant.messages.stream(model=model, max_tokens=10, messages=USER) as stream:
        final = stream.get_final_message()
    assert anthropic_text(final) == ANSWER and final.stop_reason == "end_turn"


@pytest.mark.parametrize(
    ("api", "model", "stream"),
    [
        ("openai", "hang", False),
        ("anthropic", "hang", True),
        ("anthropic", "pings", False),
        ("openai", "endless", False),
    ],
)
def test_no_headers_within_300ms(
    base: str, http: httpx.Client, api: str, model: str, stream: bool
) -> None:
    start = time.monotonic()
    with pytest.raises(httpx.ReadTimeout), httpx.Client(timeout=httpx.Timeout(5.0, read=0.3)) as c:
        c.post(base + path_of(api), json=request_body(model, stream=stream))
    assert time.monotonic() - start >= 0.29
    assert_all_closed(http)


@pytest.mark.parametrize("api", APIS)
def test_silent_and_silent_after_content(base: str, http: httpx.Client, api: str) -> None:
    resp, raw, _ = read_raw_stream(base, api, "silent", 0.3)
    assert resp.status_code == 200
    assert len(parse_sse(raw)) == 1  # the stream start, then nothing
    resp, raw, _ = read_raw_stream(base, api, "silent-after-content:after_chunks=2", 0.3)
    frames = parse_sse(raw)
    text = "".join(
        f.json()["choices"][0]["delta"].get("content", "")
        if api == "openai"
        else f.json().get("delta", {}).get("text", "")
        for f in frames
    )
    assert text == "Stand-in partial answer part 1 "
    # non-streamed: the headers come, the body never does
    with (
        httpx.Client(timeout=httpx.Timeout(5.0, read=0.3)) as client,
        client.stream("POST", base + path_of(api), json=request_body("silent")) as response,
    ):
        assert response.status_code == 200
        with pytest.raises(httpx.ReadTimeout):
            response.read()
    assert_all_closed(http)


def test_trickle_non_streamed(oai: openai.OpenAI, base: str) -> None:
    model = "trickle:interval_ms=10,bytes=40,duration_ms=250"
    start = time.monotonic()
    completion = oai.chat.completions.create(model=model, messages=USER)
    assert time.monotonic() - start >= 0.2
    assert completion.choices[0].message.content == ANSWER
    with (
        httpx.Client(timeout=5) as client,
        client.stream("POST", base + "/v1/messages", json=request_body(model)) as resp,
    ):
        total = int(resp.headers["content-length"])
        chunks = list(resp.iter_raw())
    assert len(chunks) >= 10 and sum(map(len, chunks)) == total == 1000
    assert json.loads(b"".join(chunks))["content"][0]["text"] == ANSWER


def test_trickle_streamed(ant: anthropic.Anthropic, base: str) -> None:
    # A second of a 30 ms trickle: at least 5 keepalives even when the machine is loaded (in
    # 0.3 s, one late chunk past the read timeout once ended the read after the first).
    _, raw, times = read_raw_stream(base, "openai", "trickle:interval_ms=30", 1.0)
    assert set(raw) <= set(b":\n") and len(raw) >= 5
    assert times[0] >= 0.0 and len(times) >= 5
    with ant.messages.stream(
        model="trickle:interval_ms=10,bytes=3,duration_ms=100", max_tokens=10, messages=USER
    ) as stream:
        final = stream.get_final_message()
    assert anthropic_text(final) == ANSWER


def test_endless_streams_until_the_client_leaves(oai: openai.OpenAI, http: httpx.Client) -> None:
    stream = oai.chat.completions.create(model="endless:interval_ms=5", messages=USER, stream=True)
    words = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            words.append(chunk.choices[0].delta.content)
        if len(words) == 10:
            break
    stream.close()
    assert words == [f"word{i} " for i in range(10)]
    assert_all_closed(http)
