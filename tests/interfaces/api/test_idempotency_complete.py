"""``Idempotency-Key`` on ``POST /agents/{name}/complete``, and a key left in flight by a web
process that died (architecture.md §14.2, API.md "Idempotency-Key"): against the service as a
real ASGI server, counting the stand-in provider's requests."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from django.db import connection, transaction
from django.utils import timezone

from agentops.models import IdempotencyKey, Project
from agentops.tokens import api_token_check, api_token_create
from inference.models import InferenceCall
from tests.agentops.live_asgi import SERVER_PIDS, asgi_server
from tests.conftest import wait_for
from tests.factories import AgentFactory, IdempotencyKeyFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

# The servers' in-flight bound, short for the tests (by default it is the absolute call bound
# plus a minute); a test moves a key past it by moving its claim back, rather than sleeping.
INFLIGHT_MS = 30_000
SERVER_ENV = {"AGENTOPS_IDEMPOTENCY_INFLIGHT_MS": str(INFLIGHT_MS)}
BODY = {"messages": [{"participant": "alice", "content": "summarise"}]}
ANSWER = "Stand-in answer to: alice: summarise"


@pytest.fixture(scope="module")
def server(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    yield from asgi_server("idempotency-complete", SERVER_ENV)


def post(
    base: str, token: str, agent: str, key: str | bytes, body: Any = BODY, timeout: float = 30
) -> httpx.Response:
    return httpx.post(
        f"{base}/api/v1/agents/{agent}/complete",
        content=json.dumps(body).encode(),
        headers={
            b"authorization": f"Bearer {token}".encode(),
            b"content-type": b"application/json",
            b"idempotency-key": key if isinstance(key, bytes) else key.encode(),
        },
        timeout=timeout,
    )


def at_once(count: int, send: Callable[[], httpx.Response]) -> list[httpx.Response]:
    """``send`` from ``count`` threads at once; their responses."""
    answers: list[httpx.Response] = []
    for thread in started(count, send, answers):
        thread.join(60)
    assert len(answers) == count
    return answers


def started(
    count: int, send: Callable[[], httpx.Response], answers: list[httpx.Response]
) -> list[threading.Thread]:
    start = threading.Barrier(count)

    def one() -> None:
        start.wait(10)
        answers.append(send())

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads


def takeovers_waiting() -> int:
    """How many claims wait on a lock to delete a key (a takeover's conditional delete)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # else a transaction reads one snapshot
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE 'DELETE %%agentops_idempotencykey%%'"
        )
        return int(cursor.fetchone()[0])


def test_a_repeated_complete_is_replayed_with_no_provider_call(
    standin_requests: Any, server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent()
    key = str(uuid.uuid4())
    first = post(server, user_token, agent.name, key)
    again = post(server, user_token, agent.name, key)
    assert first.status_code == again.status_code == 200, first.content
    assert first.json()["content"] == ANSWER
    assert again.content == first.content  # the same call, its row's id and all
    assert "idempotent-replayed" not in first.headers
    assert again.headers["idempotent-replayed"] == "true"
    assert len(standin_requests()) == 1
    assert InferenceCall.objects.filter(agent=agent).count() == 1


def test_twenty_concurrent_duplicates_make_one_provider_call(
    standin_requests: Any, server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent(model="answer:delay_ms=400")
    key = str(uuid.uuid4())
    answers = at_once(20, lambda: post(server, user_token, agent.name, key))
    assert len(standin_requests()) == 1
    assert {a.status_code for a in answers} <= {200, 409}
    answered = {a.content for a in answers if a.status_code == 200}
    assert len(answered) == 1  # the one call's answer, replayed to any repeat after it
    for refused in (a for a in answers if a.status_code == 409):
        assert refused.json()["data"] == {"field": "Idempotency-Key", "in_flight": True}
    assert InferenceCall.objects.filter(agent=agent).count() == 1


def test_a_repeat_while_the_first_is_in_flight_is_a_409_then_replayed(
    standin_requests: Any, server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent(model="answer:delay_ms=1500")
    key = str(uuid.uuid4())
    first: list[httpx.Response] = []
    thread = threading.Thread(
        target=lambda: first.append(post(server, user_token, agent.name, key))
    )
    thread.start()
    wait_for(lambda: len(standin_requests()) == 1, what="the first request's provider call")
    refused = post(server, user_token, agent.name, key)
    assert refused.status_code == 409, refused.content
    assert refused.json()["data"] == {"field": "Idempotency-Key", "in_flight": True}
    assert "in flight" in refused.json()["message"]
    thread.join(20)
    replay = post(server, user_token, agent.name, key)
    assert replay.headers["idempotent-replayed"] == "true"
    assert replay.content == first[0].content
    assert len(standin_requests()) == 1


def test_the_same_key_with_another_body_or_agent_is_a_422_and_no_call(
    standin_requests: Any, server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent()
    key = str(uuid.uuid4())
    assert post(server, user_token, agent.name, key).status_code == 200
    other_body = {"messages": [{"participant": "alice", "content": "something else"}]}
    for refused in (
        post(server, user_token, agent.name, key, body=other_body),
        post(server, user_token, make_agent().name, key),
    ):
        assert refused.status_code == 422, refused.content
        assert refused.json()["code"] == "unprocessable"
        assert refused.json()["data"]["field"] == "Idempotency-Key"
        assert refused.json()["message"].startswith("Idempotency-Key: this key was used")
    assert len(standin_requests()) == 1


def test_keys_are_per_token_so_another_token_or_project_calls_on_its_own(
    standin_requests: Any, server: str, user_token: str, make_agent: Any, providers: Any
) -> None:
    agent = make_agent()
    key = str(uuid.uuid4())
    other_token = api_token_create(name="other", operator=False)[1]
    _, elsewhere_token = api_token_create(name="elsewhere", operator=False, project="elsewhere")
    elsewhere_agent = AgentFactory.create(
        provider=providers["openai"], project=Project.objects.get(name="elsewhere")
    )
    mine = post(server, user_token, agent.name, key)
    theirs = post(server, other_token, agent.name, key)
    elsewhere = post(server, elsewhere_token, elsewhere_agent.name, key)
    assert mine.status_code == theirs.status_code == elsewhere.status_code == 200
    for response in (mine, theirs, elsewhere):
        assert "idempotent-replayed" not in response.headers
    assert theirs.json()["call"]["id"] != mine.json()["call"]["id"]
    assert len(standin_requests()) == 3


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"", "must not be empty"),
        (b"k" * 256, "at most 255"),
        (b"a\tb", "control characters"),
        (b"a\x85b", "control characters"),  # a C1 control (NEXT LINE) as its Latin-1 byte
    ],
)
def test_a_malformed_key_is_a_400_naming_the_header_and_no_call(
    standin_requests: Any, server: str, user_token: str, make_agent: Any, value: bytes, why: str
) -> None:
    agent = make_agent()
    response = post(server, user_token, agent.name, value)
    assert response.status_code == 400, response.content
    assert response.json()["data"]["errors"][0]["field"] == "Idempotency-Key"
    assert why in response.json()["message"]
    assert standin_requests() == []
    assert not IdempotencyKey.objects.exists()


def test_a_transient_failure_releases_the_key_and_a_refusal_is_replayed(
    standin_requests: Any, server: str, user_token: str, make_agent: Any
) -> None:
    failing = make_agent(model="error:status=500")
    key = str(uuid.uuid4())
    assert post(server, user_token, failing.name, key).status_code == 502
    sent = len(standin_requests())
    again = post(server, user_token, failing.name, key)
    assert again.status_code == 502
    assert "idempotent-replayed" not in again.headers
    assert len(standin_requests()) == 2 * sent  # called again: no answer had been received
    # The provider's refusal of the request itself is the answer: the same body gets it again.
    refusing = make_agent(model="error:status=400")
    key = str(uuid.uuid4())
    first = post(server, user_token, refusing.name, key)
    assert first.status_code == 502 and first.json()["data"]["http_status"] == 400
    sent = len(standin_requests())
    replay = post(server, user_token, refusing.name, key)
    assert (replay.status_code, replay.content) == (502, first.content)
    assert replay.headers["idempotent-replayed"] == "true"
    assert len(standin_requests()) == sent


# --- a key left in flight -------------------------------------------------------------------


def abandoned(agent: str, token: str, key: str, *, age: timedelta) -> IdempotencyKey:
    """The row a request leaves when its web process dies mid-call, claimed ``age`` ago."""
    owner = api_token_check(token)
    assert owner is not None
    return IdempotencyKeyFactory.create(
        token=owner, key=key, agent=agent, body=json.dumps(BODY).encode(), age=age
    )


def test_an_in_flight_key_is_a_409_until_the_bound_then_called_again(
    standin_requests: Any, server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent()
    bound = timedelta(milliseconds=INFLIGHT_MS)
    young = str(uuid.uuid4())
    abandoned(agent.name, user_token, young, age=bound - timedelta(seconds=2))
    refused = post(server, user_token, agent.name, young)
    assert refused.status_code == 409, refused.content
    assert refused.json()["data"]["in_flight"] is True
    assert "AGENTOPS_IDEMPOTENCY_INFLIGHT_MS" in refused.json()["message"]
    assert standin_requests() == []
    old = str(uuid.uuid4())
    abandoned(agent.name, user_token, old, age=bound + timedelta(seconds=1))
    taken = post(server, user_token, agent.name, old)
    assert taken.status_code == 200, taken.content
    assert taken.json()["content"] == ANSWER
    assert "idempotent-replayed" not in taken.headers
    assert post(server, user_token, agent.name, old).content == taken.content  # now replayed
    assert len(standin_requests()) == 1
    row = IdempotencyKey.objects.get(key=old)
    assert row.status == IdempotencyKey.Status.DONE


def test_an_abandoned_key_with_another_body_is_still_a_422(
    standin_requests: Any, server: str, user_token: str, make_agent: Any
) -> None:
    agent = make_agent()
    key = str(uuid.uuid4())
    abandoned(agent.name, user_token, key, age=timedelta(milliseconds=INFLIGHT_MS * 2))
    other = {"messages": [{"participant": "alice", "content": "other"}]}
    assert post(server, user_token, agent.name, key, body=other).status_code == 422
    assert standin_requests() == []


def test_a_key_left_in_flight_by_a_killed_web_process_is_taken_over_once_after_the_bound(
    standin_requests: Any,
    server: str,
    user_token: str,
    make_agent: Any,
) -> None:
    # The first call is slow (the process is killed while it waits on it); any later one answers.
    steps = ("answer:delay_ms=60000", "answer")
    agent = make_agent(model="sequence:steps=" + "|".join(quote(s, safe="") for s in steps))
    key = str(uuid.uuid4())
    lost: list[BaseException] = []
    with contextmanager(asgi_server)("idempotency-doomed", SERVER_ENV) as doomed:

        def first() -> None:
            try:
                post(doomed, user_token, agent.name, key, timeout=90)
            except httpx.HTTPError as exc:
                lost.append(exc)

        thread = threading.Thread(target=first)
        thread.start()
        wait_for(lambda: len(standin_requests()) == 1, what="the first request's provider call")
        os.kill(SERVER_PIDS[doomed], signal.SIGKILL)
        thread.join(20)
    assert lost, "the killed server's client should have lost its connection"
    (row,) = IdempotencyKey.objects.filter(key=key)
    assert row.status == IdempotencyKey.Status.IN_FLIGHT  # nobody is left to answer or release it

    # Before the bound: the request may still be running somewhere, so no second call.
    refused = post(server, user_token, agent.name, key)
    assert refused.status_code == 409, refused.content
    assert refused.json()["data"]["in_flight"] is True
    assert len(standin_requests()) == 1

    # Past the bound: of several repeats at once, exactly one takes the key over and calls. The
    # row is held locked until at least two of them found it abandoned and wait to take it over,
    # so they race for it, rather than one taking it before another has looked.
    IdempotencyKey.objects.filter(pk=row.pk).update(
        created_at=row.created_at - timedelta(milliseconds=INFLIGHT_MS)
    )
    answers: list[httpx.Response] = []
    with transaction.atomic():
        IdempotencyKey.objects.select_for_update().get(pk=row.pk)
        threads = started(8, lambda: post(server, user_token, agent.name, key), answers)
        wait_for(lambda: takeovers_waiting() >= 2, what="two repeats waiting to take the key")
    for thread in threads:
        thread.join(60)
    assert len(answers) == 8
    assert len(standin_requests()) == 2
    assert {a.status_code for a in answers} <= {200, 409}, [a.content for a in answers]
    answered = {a.content for a in answers if a.status_code == 200}
    assert len(answered) == 1
    assert json.loads(answered.pop())["content"] == ANSWER
    replay = post(server, user_token, agent.name, key)
    assert replay.status_code == 200 and replay.json()["content"] == ANSWER
    assert replay.headers["idempotent-replayed"] == "true"
    assert len(standin_requests()) == 2


def test_a_slow_first_claim_cannot_undo_the_claim_that_replaced_it(
    user_token: str, make_agent: Any, settings: Any
) -> None:
    """A first request that was only slow, not dead, answers or releases after its key was
    taken over: its claim is gone, and the taker's row is left as the taker leaves it."""
    from agentops.idempotency import (
        idempotency_key_answer,
        idempotency_key_claim,
        idempotency_key_release,
    )

    settings.AGENTOPS_IDEMPOTENCY_INFLIGHT_S = INFLIGHT_MS / 1000
    token = api_token_check(user_token)
    assert token is not None

    def claimed(at: Any) -> Any:
        return idempotency_key_claim(
            token_id=token.pk, key="slow", endpoint="e", digest="d", agent="a", now=at
        )

    now = timezone.now()
    first = claimed(now)
    taker = claimed(now + timedelta(milliseconds=INFLIGHT_MS + 1000))
    assert taker.kind == "new" and taker.row_id != first.row_id
    idempotency_key_release(row_id=first.row_id)
    idempotency_key_answer(row_id=first.row_id, status=200, headers={}, body=b"late")
    (row,) = IdempotencyKey.objects.filter(key="slow")
    assert (row.pk, row.status, row.response_body) == (taker.row_id, "in_flight", None)
