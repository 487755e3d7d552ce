"""What the stand-in's tests share: the question, request bodies, an SSE reader."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import openai

from tests.conftest import wait_for

QUESTION = "hello there"
ANSWER = f"Stand-in answer to: {QUESTION}"
USER: Any = [{"role": "user", "content": QUESTION}]
APIS = ("openai", "anthropic")


def path_of(api: str) -> str:
    return "/v1/chat/completions" if api == "openai" else "/v1/messages"


def request_body(model: str, *, stream: bool = False, messages: Any = None) -> dict[str, Any]:
    return {
        "model": model,
        "max_tokens": 256,
        "stream": stream,
        "messages": USER if messages is None else messages,
    }


@dataclass
class SSE:
    event: str | None = None
    data: str | None = None
    comments: list[str] = field(default_factory=list)

    def json(self) -> Any:
        assert self.data is not None
        return json.loads(self.data)


def parse_sse(raw: bytes) -> list[SSE]:
    """Complete SSE frames in ``raw`` (a trailing partial frame is dropped)."""
    frames: list[SSE] = []
    text = raw.decode()
    for block in text.split("\n\n")[:-1]:
        frame = SSE()
        for line in block.split("\n"):
            if line.startswith(":"):
                frame.comments.append(line[1:].strip())
            elif line.startswith("event:"):
                frame.event = line[6:].strip()
            elif line.startswith("data:"):
                frame.data = line[5:].strip()
        frames.append(frame)
    return frames


def read_raw_stream(
    base: str, api: str, model: str, seconds: float
) -> tuple[httpx.Response, bytes, list[float]]:
    """Stream a request for about ``seconds`` (or until it ends or goes quiet that long).

    Returns the response, the bytes and the arrival time of each chunk.
    """
    chunks: list[bytes] = []
    times: list[float] = []
    start = time.monotonic()
    with (
        httpx.Client(timeout=httpx.Timeout(5.0, read=seconds)) as client,
        client.stream("POST", base + path_of(api), json=request_body(model, stream=True)) as resp,
    ):
        try:
            for chunk in resp.iter_raw():
                chunks.append(chunk)
                times.append(time.monotonic() - start)
                if time.monotonic() - start >= seconds:
                    break
        except httpx.ReadTimeout:
            pass
    return resp, b"".join(chunks), times


def openai_stream_text(oai: openai.OpenAI, model: str, messages: Any = None) -> tuple[str, str]:
    text, reasoning, finish = [], [], None
    stream = oai.chat.completions.create(
        model=model, messages=USER if messages is None else messages, stream=True
    )
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text.append(choice.delta.content or "")
        reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
        finish = choice.finish_reason or finish
    assert finish is not None
    return "".join(text), "".join(reasoning) + "|" + finish


def anthropic_text(message: anthropic.types.Message) -> str:
    return "".join(b.text for b in message.content if isinstance(b, anthropic.types.TextBlock))


def assert_all_closed(http: httpx.Client, within: float = 2.0) -> None:
    """The stand-in notices that its clients left and stops serving them promptly."""
    wait_for(
        lambda: http.get("/_standin/open").json() == {"open": 0},
        timeout=within,
        interval=0.02,
        what="the stand-in to end the responses its clients left",
    )


def error_object(api: str, body: Any) -> dict[str, Any]:
    if api == "anthropic":
        assert body["type"] == "error"
    error = body["error"]
    assert isinstance(error, dict) and isinstance(error["message"], str)
    if api == "openai":
        assert {"message", "type", "param", "code"} <= set(error)
    return error
