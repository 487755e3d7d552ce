"""``Idempotency-Key`` (architecture.md §14.2, API.md): through the official ``openai`` and
``anthropic`` SDKs (neither sends the header by itself: their ``_idempotency_header`` is None,
so a client passes it in ``extra_headers``) against the service as a real ASGI server, counting
the stand-in provider's requests; and on ``POST /agents/{name}/turns``."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import anthropic
import httpx
import openai
import pytest
from django.conf import settings
from django.test import Client
from django.utils import timezone

from agentops.models import HistoryRow, IdempotencyKey
from agentops.tokens import api_token_create
from inference.models import InferenceCall, Turn
from interfaces.tasks import idempotency_sweep
from tests.agentops.live_asgi import asgi_server
from tests.conftest import wait_for
from tests.factories import AgentFactory, ProviderFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

USER: Any = [{"role": "user", "content": "hi"}]
RECORD_BYTES = 4096  # the server's bound on a recorded answer, small so a long stream passes it


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    yield from asgi_server("idempotency", {"AGENTOPS_IDEMPOTENCY_RECORD_BYTES": str(RECORD_BYTES)})


@pytest.fixture
def oai(server: str, user_token: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0, timeout=20)
    yield client
    client.close()


@pytest.fixture
def ant(server: str, user_token: str) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=server, api_key=user_token, max_retries=0, timeout=20)
    yield client
    client.close()


def key_headers(key: str | None = None) -> dict[str, str]:
    return {"Idempotency-Key": key or str(uuid.uuid4())}


def test_the_sdks_send_no_idempotency_header_of_their_own(
    oai: openai.OpenAI, ant: anthropic.Anthropic
) -> None:
    # What this feature's docs tell clients: pass the header, the SDK will not.
    assert oai._idempotency_header is None
    assert ant._idempotency_header is None


def test_a_repeated_chat_completion_is_replayed_with_no_provider_call(
    standin_requests: Any, oai: openai.OpenAI, make_agent: Any
) -> None:
    agent = make_agent()
    headers = key_headers()
    first = oai.chat.completions.with_raw_response.create(
        model=agent.name, messages=USER, extra_headers=headers
    )
    again = oai.chat.completions.with_raw_response.create(
        model=agent.name, messages=USER, extra_headers=headers
    )
    assert len(standin_requests()) == 1
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert again.status_code == 200
    assert again.parse().id == first.parse().id
    assert again.parse().choices[0].message.content == "Stand-in answer to: hi"


def test_a_repeated_stream_is_streamed_again_as_sse_with_no_provider_call(
    standin_requests: Any, oai: openai.OpenAI, make_agent: Any
) -> None:
    agent = make_agent(model="answer:chunks=4")
    headers = key_headers()

    def streamed() -> tuple[str, str | None]:
        with oai.chat.completions.with_streaming_response.create(
            model=agent.name, messages=USER, stream=True, extra_headers=headers
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            text = "".join(
                chunk.choices[0].delta.content or "" for chunk in response.parse() if chunk.choices
            )
            return text, response.headers.get("idempotent-replayed")

    assert streamed() == ("Stand-in answer to: hi", None)
    assert streamed() == ("Stand-in answer to: hi", "true")
    assert len(standin_requests()) == 1


def test_anthropic_messages_are_replayed_streamed_or_not(
    standin_requests: Any, ant: anthropic.Anthropic, make_agent: Any
) -> None:
    agent = make_agent(provider="anthropic")
    headers = key_headers()
    kwargs: Any = {"model": agent.name, "max_tokens": 50, "messages": USER}
    first = ant.messages.create(**kwargs, extra_headers=headers)
    again = ant.messages.with_raw_response.create(**kwargs, extra_headers=headers)
    assert again.headers["idempotent-replayed"] == "true"
    assert again.parse().id == first.id
    streamed_headers = key_headers()
    texts = []
    for _ in range(2):
        with ant.messages.stream(**kwargs, extra_headers=streamed_headers) as stream:
            texts.append(stream.get_final_text())
    assert texts == ["Stand-in answer to: hi"] * 2
    assert len(standin_requests()) == 2  # one for each key


def test_a_repeated_response_is_replayed_streamed_or_not(
    standin_requests: Any, standin: str, oai: openai.OpenAI
) -> None:
    provider = ProviderFactory.create(
        name="standin-responses", kind="openai-responses", base_url=f"{standin}/v1"
    )
    agent = AgentFactory.create(provider=provider, model="answer")
    headers, streamed = key_headers(), key_headers()
    first = oai.responses.create(model=agent.name, input="hi", extra_headers=headers)
    again = oai.responses.with_raw_response.create(
        model=agent.name, input="hi", extra_headers=headers
    )
    assert again.headers["idempotent-replayed"] == "true"
    assert again.parse().id == first.id
    runs = [
        [
            e.type
            for e in oai.responses.create(
                model=agent.name, input="hi", stream=True, extra_headers=streamed
            )
        ]
        for _ in range(2)
    ]
    assert runs[0] == runs[1] and runs[0][-1] == "response.completed"
    assert len(standin_requests()) == 2  # one for each key


def test_concurrent_duplicates_make_exactly_one_provider_call(
    standin_requests: Any, server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent(model="answer:delay_ms=400")
    headers = key_headers()
    outcomes: list[Any] = []

    def send() -> None:
        client = openai.OpenAI(base_url=f"{server}/v1", api_key=user_token, max_retries=0)
        try:
            outcomes.append(
                client.chat.completions.create(
                    model=agent.name, messages=USER, extra_headers=headers
                ).id
            )
        except openai.ConflictError as exc:
            outcomes.append(exc.status_code)
        finally:
            client.close()

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(standin_requests()) == 1
    assert len(outcomes) == 8
    answered = {o for o in outcomes if isinstance(o, str)}
    assert len(answered) == 1  # the one call's answer, replayed to any repeat after it
    # One provider call, so one call row, whatever the 8 saw.
    assert InferenceCall.objects.filter(agent=agent).count() == 1


def test_a_repeat_while_the_first_is_in_flight_is_a_409_then_replayed(
    standin_requests: Any, oai: openai.OpenAI, make_agent: Any
) -> None:
    agent = make_agent(model="answer:delay_ms=1500")
    headers = key_headers()
    first: list[str] = []
    thread = threading.Thread(
        target=lambda: first.append(
            oai.chat.completions.create(model=agent.name, messages=USER, extra_headers=headers).id
        )
    )
    thread.start()
    wait_for(
        lambda: IdempotencyKey.objects.filter(key=headers["Idempotency-Key"]).exists(),
        what="the first request's key",
    )
    with pytest.raises(openai.ConflictError) as raised:
        oai.chat.completions.create(model=agent.name, messages=USER, extra_headers=headers)
    assert "in flight" in raised.value.message
    assert raised.value.body["param"] == "Idempotency-Key"  # type: ignore[index]
    thread.join(20)
    replay = oai.chat.completions.create(model=agent.name, messages=USER, extra_headers=headers)
    assert replay.id == first[0]
    assert len(standin_requests()) == 1


def test_the_same_key_with_another_body_is_a_422_and_no_call(
    standin_requests: Any, oai: openai.OpenAI, make_agent: Any
) -> None:
    agent = make_agent()
    headers = key_headers()
    oai.chat.completions.create(model=agent.name, messages=USER, extra_headers=headers)
    with pytest.raises(openai.UnprocessableEntityError) as raised:
        oai.chat.completions.create(
            model=agent.name, messages=[{"role": "user", "content": "other"}], extra_headers=headers
        )
    assert "different request" in raised.value.message
    assert len(standin_requests()) == 1


def test_keys_are_per_token(
    standin_requests: Any, server: str, oai: openai.OpenAI, make_agent: Any
) -> None:
    agent = make_agent()
    headers = key_headers()
    other = openai.OpenAI(
        base_url=f"{server}/v1",
        api_key=api_token_create(name="other", operator=False)[1],
        max_retries=0,
    )
    mine = oai.chat.completions.create(model=agent.name, messages=USER, extra_headers=headers)
    theirs = other.chat.completions.with_raw_response.create(
        model=agent.name, messages=USER, extra_headers=headers
    )
    other.close()
    assert "idempotent-replayed" not in theirs.headers
    assert theirs.parse().id != mine.id
    assert len(standin_requests()) == 2


def test_an_expired_key_is_a_new_request_and_the_sweep_deletes_it(
    standin_requests: Any, oai: openai.OpenAI, make_agent: Any
) -> None:
    agent = make_agent()
    headers, kept = key_headers(), key_headers()
    oai.chat.completions.create(model=agent.name, messages=USER, extra_headers=headers)
    oai.chat.completions.create(model=agent.name, messages=USER, extra_headers=kept)
    ttl = timedelta(seconds=settings.AGENTOPS_IDEMPOTENCY_TTL_S)
    IdempotencyKey.objects.filter(key=headers["Idempotency-Key"]).update(
        created_at=timezone.now() - ttl - timedelta(seconds=1)
    )
    again = oai.chat.completions.with_raw_response.create(
        model=agent.name, messages=USER, extra_headers=headers
    )
    assert "idempotent-replayed" not in again.headers
    assert len(standin_requests()) == 3
    IdempotencyKey.objects.filter(key=headers["Idempotency-Key"]).update(
        created_at=timezone.now() - ttl - timedelta(seconds=1)
    )
    assert idempotency_sweep() == 1
    assert list(IdempotencyKey.objects.values_list("key", flat=True)) == [kept["Idempotency-Key"]]
    assert settings.CELERY_BEAT_SCHEDULE["idempotency-sweep"]["task"] == idempotency_sweep.name


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("", "must not be empty"),
        ("k" * 256, "at most 255"),
        ("a\tb", "control characters"),
        # C1 controls, as their Latin-1 bytes on the wire: NEXT LINE and CSI.
        (b"a\x85b", "control characters"),
        (b"a\x9bb", "control characters"),
    ],
)
def test_a_malformed_key_is_a_400_naming_the_header_and_no_call(
    standin_requests: Any,
    server: str,
    user_token: str,
    make_agent: Any,
    value: str | bytes,
    why: str,
) -> None:
    agent = make_agent()
    response = httpx.post(
        f"{server}/v1/chat/completions",
        json={"model": agent.name, "messages": USER},
        headers={
            b"Authorization": f"Bearer {user_token}".encode(),
            b"Idempotency-Key": value if isinstance(value, bytes) else value.encode(),
        },
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "Idempotency-Key"
    assert why in response.json()["error"]["message"]
    assert standin_requests() == []
    assert not IdempotencyKey.objects.exists()


def test_a_transient_failure_releases_the_key_so_a_retry_calls_again(
    standin_requests: Any, oai: openai.OpenAI, make_agent: Any
) -> None:
    agent = make_agent(model="error:status=400,times=1")
    headers = key_headers()
    # The provider's refusal of the request itself is the answer: kept and replayed.
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=agent.name, messages=USER, extra_headers=headers)
    with pytest.raises(openai.BadRequestError) as replayed:
        oai.chat.completions.create(model=agent.name, messages=USER, extra_headers=headers)
    assert replayed.value.response.headers["idempotent-replayed"] == "true"
    assert len(standin_requests()) == 1
    failing = make_agent(model="error:status=500,times=2")  # the drop-in's retry fails too
    headers = key_headers()
    with pytest.raises(openai.InternalServerError):
        oai.chat.completions.create(model=failing.name, messages=USER, extra_headers=headers)
    answer = oai.chat.completions.with_raw_response.create(
        model=failing.name, messages=USER, extra_headers=headers
    )
    assert "idempotent-replayed" not in answer.headers
    assert len(standin_requests()) == 1 + 3


def test_an_answer_too_large_to_record_is_a_409_on_repeat_never_a_second_call(
    standin_requests: Any, oai: openai.OpenAI, make_agent: Any
) -> None:
    agent = make_agent(model="answer:chunks=100,interval_ms=0")
    headers = key_headers()
    stream = oai.chat.completions.create(
        model=agent.name, messages=USER, stream=True, extra_headers=headers
    )
    assert len(list(stream)) > 20
    row = IdempotencyKey.objects.get(key=headers["Idempotency-Key"])
    assert row.status == IdempotencyKey.Status.UNREPLAYABLE
    with pytest.raises(openai.ConflictError) as raised:
        oai.chat.completions.create(
            model=agent.name, messages=USER, stream=True, extra_headers=headers
        )
    assert "AGENTOPS_IDEMPOTENCY_RECORD_BYTES" in raised.value.message
    assert len(standin_requests()) == 1


# --- turns ----------------------------------------------------------------------------------


def post_turn(client: Client, agent: str, content: str, key: str | None) -> Any:
    body = {"messages": [{"participant": "alice", "content": content}]}
    return client.post(
        f"/api/v1/agents/{agent}/turns",
        data=json.dumps(body),
        content_type="application/json",
        headers={"Idempotency-Key": key} if key is not None else {},
    )


def test_a_repeated_turn_answers_the_same_turn_and_queues_none(
    api: Client, no_workers: None, make_agent: Any
) -> None:
    agent = make_agent()
    key = str(uuid.uuid4())
    first = post_turn(api, agent.name, "hello", key)
    again = post_turn(api, agent.name, "hello", key)
    assert first.status_code == again.status_code == 202
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert Turn.objects.filter(agent=agent).count() == 1
    assert HistoryRow.objects.filter(agent=agent).count() == 1  # not joined again either
    other = post_turn(api, agent.name, "something else", key)
    assert other.status_code == 422
    refused = other.json()
    assert refused["code"] == "unprocessable"
    # Shaped as a 400 is: the field, and data.errors with the message less the field's name.
    assert refused["data"]["field"] == "Idempotency-Key"
    assert refused["data"]["errors"] == [
        {
            "field": "Idempotency-Key",
            "message": refused["message"].removeprefix("Idempotency-Key: "),
        }
    ]
    assert refused["message"].startswith("Idempotency-Key: this key was used")
    # Another agent's turn under the key is another request: refused too.
    assert post_turn(api, make_agent().name, "hello", key).status_code == 422
    bad = post_turn(api, agent.name, "hello", "")
    assert bad.status_code == 400
    assert bad.json()["data"]["errors"][0]["field"] == "Idempotency-Key"
    assert Turn.objects.filter(agent=agent).count() == 1


def test_a_refused_turn_releases_its_key(api: Client, no_workers: None, make_agent: Any) -> None:
    agent = make_agent()
    key = str(uuid.uuid4())
    sixty = json.dumps({"messages": [{"participant": "alice", "content": "x"}] * 60})
    queued = api.post(
        f"/api/v1/agents/{agent.name}/turns", data=sixty, content_type="application/json"
    )
    assert queued.status_code == 202
    # Joining the queued turn would pass its message limit: refused by the service, after the
    # key was claimed. The key is released, so the client may send it again once it can join.
    refused = api.post(
        f"/api/v1/agents/{agent.name}/turns",
        data=sixty,
        content_type="application/json",
        headers={"Idempotency-Key": key},
    )
    assert refused.status_code == 409, refused.content
    assert refused.json()["data"]["field"] == "messages"
    assert not IdempotencyKey.objects.filter(key=key).exists()


def test_concurrent_duplicate_turns_queue_exactly_one(
    operator_token: str, no_workers: None, make_agent: Any
) -> None:
    agent = make_agent()
    key = str(uuid.uuid4())
    answers: list[Any] = []

    def send() -> None:
        from django.db import connection

        try:
            client = Client(headers={"Authorization": f"Bearer {operator_token}"})
            response = post_turn(client, agent.name, "hello", key)
            answers.append((response.status_code, response.json().get("id")))
        finally:
            connection.close()

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    (turn,) = Turn.objects.filter(agent=agent)
    assert len(answers) == 8
    assert {a for a in answers if a[0] == 202} == {(202, turn.pk)}
    assert all(status in (202, 409) for status, _ in answers)
    # A duplicate that got through would have joined the queued turn: same id, another message.
    assert HistoryRow.objects.filter(agent=agent).count() == 1


def test_a_held_models_429_releases_the_key_so_the_retry_calls(
    standin_requests: Any, oai: openai.OpenAI, make_agent: Any
) -> None:
    from waits.clock import clock_ms
    from waits.services import wait_record

    agent = make_agent()
    headers = key_headers()
    wait_record(
        agent=agent,
        model=agent.model,
        retry_after_ms=60_000,
        reason="rate_limit (HTTP 429): test",
        now_ms=clock_ms(),
    )
    with pytest.raises(openai.RateLimitError):
        oai.chat.completions.create(model=agent.name, messages=USER, extra_headers=headers)
    assert not IdempotencyKey.objects.exists()
    assert standin_requests() == []


def test_anthropic_conflicts_through_the_sdk(
    standin_requests: Any, ant: anthropic.Anthropic, make_agent: Any
) -> None:
    agent = make_agent(provider="anthropic", model="answer:delay_ms=1500")
    headers = key_headers()
    kwargs: Any = {"model": agent.name, "max_tokens": 50, "messages": USER}
    thread = threading.Thread(target=lambda: ant.messages.create(**kwargs, extra_headers=headers))
    thread.start()
    wait_for(
        lambda: IdempotencyKey.objects.filter(key=headers["Idempotency-Key"]).exists(),
        what="the first request's key",
    )
    with pytest.raises(anthropic.ConflictError):
        ant.messages.create(**kwargs, extra_headers=headers)
    thread.join(20)
    with pytest.raises(anthropic.UnprocessableEntityError):
        ant.messages.create(**{**kwargs, "max_tokens": 51}, extra_headers=headers)
    assert len(standin_requests()) == 1


def test_a_stream_whose_text_names_the_terminal_event_is_recorded_whole(
    standin_requests: Any, oai: openai.OpenAI, make_agent: Any
) -> None:
    # The model says "data: [DONE]" in its delta: inside a JSON string, not the end.
    agent = make_agent(model="answer:text=data%3A%20%5BDONE%5D%20said%20it,chunks=1,interval_ms=80")
    headers = key_headers()
    runs = [
        [
            (chunk.choices[0].delta.content, chunk.choices[0].finish_reason)
            for chunk in oai.chat.completions.create(
                model=agent.name, messages=USER, stream=True, extra_headers=headers
            )
            if chunk.choices
        ]
        for _ in range(2)
    ]
    assert ("data: [DONE] said it", None) in runs[0]
    assert runs[0][-1][1] == "stop"
    assert runs[1] == runs[0]
    assert len(standin_requests()) == 1
