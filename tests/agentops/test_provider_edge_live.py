"""The provider edge (architecture.md §15) from outside: the service's own web process (uvicorn) and
Celery workers against a provider that misbehaves on purpose (``tests.hostile``). Whatever the
provider sends, the call ends with a classified error naming what was refused (or with text
made safe), the web process and the worker stay up with their memory bounded, ``/health``
answers within a second meanwhile, and every request the provider received has its call row."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from django.db import connection
from django.test import Client

from agentops.models import Agent, HistoryRow
from inference.models import InferenceCall, Turn
from tests.agentops.live_asgi import SERVER_PIDS, Watch, asgi_server
from tests.conftest import WorkerPool, wait_for
from tests.factories import AgentFactory, ProviderFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]

MiB = 1 << 20
ENDED = {"succeeded", "failed", "exhausted", "cancelled", "requires_action"}


@pytest.fixture(scope="module")
def web(django_db_setup: None, django_db_blocker: Any) -> Iterator[str]:
    yield from asgi_server("edge")


@pytest.fixture
def hostile_agent(hostile: str, hostile_requests: Any) -> Callable[..., Agent]:
    provider = ProviderFactory.create(name="hostile", kind="openai", base_url=f"{hostile}/v1")

    def make(model: str, **fields: Any) -> Agent:
        agent: Agent = AgentFactory.create(provider=provider, model=model, **fields)
        return agent

    return make


def one_call_per_request(agent: Agent, requests: list[dict[str, Any]]) -> list[InferenceCall]:
    """The agent's call rows, once every request the provider received has its row."""
    wait_for(
        lambda: (
            InferenceCall.objects.filter(agent=agent, outcome__isnull=False).count()
            >= len(requests)
        ),
        what="every call's row",
    )
    calls = list(InferenceCall.objects.filter(agent=agent))
    assert len(calls) == len(requests), (calls, requests)
    return calls


COMPLETE = [
    # (model, HTTP status of /complete, the call's error type and provider code)
    ("gzip-bomb", 502, "server", "response_too_large"),
    ("repeated-header", 502, "server", "bad_response"),
    ("endless-headers", 502, "server", "bad_response"),
    ("huge-body", 502, "server", "response_too_large"),
    ("status-999", 502, "server", "bad_status"),
    ("redirect", 502, "unknown", "redirect"),
    ("html-error", 502, "server", None),
    ("nul-error", 502, "invalid_request", None),
]


@pytest.mark.parametrize(
    ("model", "status", "kind", "code"), COMPLETE, ids=[c[0] for c in COMPLETE]
)
def test_complete_in_the_web_process_ends_a_hostile_answer_as_a_classified_error(
    web: str,
    operator_token: str,
    hostile_agent: Any,
    hostile_requests: Any,
    model: str,
    status: int,
    kind: str,
    code: str | None,
) -> None:
    agent = hostile_agent(model)
    with Watch([SERVER_PIDS[web]], web, path="/health") as watch:
        response = httpx.post(
            f"{web}/api/v1/agents/{agent.name}/complete",
            json={"messages": [{"participant": "alice", "content": "hi"}]},
            headers={"Authorization": f"Bearer {operator_token}"},
            timeout=60,
        )
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert watch.checks and not watch.failures, watch.failures  # /health kept answering 200
    (call,) = one_call_per_request(agent, hostile_requests())
    assert call.outcome == "error" and (
        (call.error or {})["type"],
        (call.error or {})["provider_code"],
    ) == (kind, code), call.error
    assert "\x00" not in response.text


STREAMED_DROPIN = [
    # (model, status, the error code the client reads): failing before any byte went to the
    # client answers the non-streamed path's status; after one, 200 and an error event.
    ("long-line", 502, "line_too_long"),
    ("gzip-bomb", 502, "line_too_long"),
    ("close-after-headers", 502, "network"),
    ("close-mid-chunk", 200, "network"),
]


@pytest.mark.parametrize(
    ("model", "status", "code"), STREAMED_DROPIN, ids=[s[0] for s in STREAMED_DROPIN]
)
def test_a_streamed_drop_in_failing_before_its_first_byte_answers_an_error_status(
    web: str,
    user_token: str,
    hostile_agent: Any,
    hostile_requests: Any,
    model: str,
    status: int,
    code: str,
) -> None:
    agent = hostile_agent(model)
    response = httpx.post(
        f"{web}/v1/chat/completions",
        json={"model": agent.name, "messages": [{"role": "user", "content": "hi"}], "stream": True},
        headers={"Authorization": f"Bearer {user_token}"},
        timeout=60,
    )
    assert response.status_code == status, response.text[:500]
    if status == 200:
        assert response.text.startswith("data: ")  # the provider's first event went out
        last = response.text.strip().rsplit("\n\n", 1)[-1]
        error = json.loads(last.removeprefix("data: "))["error"]
        assert error["code"] == code, error
    else:
        assert response.headers["content-type"].startswith("application/json")
        failure = response.json()["error"]["provider_error"]
        assert (failure["provider_code"] or failure["type"]) == code, failure
    one_call_per_request(agent, hostile_requests())


@pytest.mark.parametrize("model", ["nul", "bad-utf8", "two-responses", "big-usage"])
def test_complete_stores_an_answer_with_unstorable_parts_made_safe(
    web: str, operator_token: str, hostile_agent: Any, hostile_requests: Any, model: str
) -> None:
    agent = hostile_agent(model)
    response = httpx.post(
        f"{web}/api/v1/agents/{agent.name}/complete",
        json={"messages": [{"participant": "alice", "content": "hi"}]},
        headers={"Authorization": f"Bearer {operator_token}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    expected = {
        "nul": "a\ufffdb\ufffdc",
        "bad-utf8": "caf\ufffd \ufffd\ufffd ok",
        "two-responses": "first",
        "big-usage": "counted",
    }[model]
    assert response.json()["content"] == expected
    (call,) = one_call_per_request(agent, hostile_requests())
    assert call.outcome == "completed"
    if (
        model == "big-usage"
    ):  # counts no column holds are not reported; the stop reason is cut to its column
        assert (call.input_tokens, call.output_tokens, call.stop_reason) == (None, None, "x" * 50)


def submit(api: Client, agent: Agent) -> int:
    """A turn for ``agent``, submitted in this process (its task goes to the tests' workers)."""
    response = api.post(
        f"/api/v1/agents/{agent.name}/turns",
        data={"messages": [{"participant": "alice", "content": "hi"}]},
        content_type="application/json",
    )
    assert response.status_code == 202, response.content
    return int(response.json()["id"])


STREAMED = [
    ("gzip-bomb", "server", "line_too_long"),
    ("long-line", "server", "line_too_long"),
    ("endless-headers", "server", "bad_response"),
    ("close-mid-chunk", "network", None),
]


@pytest.mark.parametrize(("model", "kind", "code"), STREAMED, ids=[s[0] for s in STREAMED])
def test_a_streamed_turn_in_the_worker_ends_its_hostile_call_as_a_classified_error(
    web: str,
    api: Client,
    workers: WorkerPool,
    hostile_agent: Any,
    hostile_requests: Any,
    model: str,
    kind: str,
    code: str | None,
) -> None:
    agent = hostile_agent(model)
    with Watch([SERVER_PIDS[web], *(p.pid for p in workers.procs)], web, path="/health") as watch:
        turn_id = submit(api, agent)
        first = wait_for(
            lambda: InferenceCall.objects.filter(agent=agent, outcome__isnull=False).first(),
            timeout=60,
            what="the first call to end",
        )
    assert watch.checks and not watch.failures, watch.failures  # /health kept answering 200
    assert first.outcome == "error" and (
        (first.error or {})["type"],
        (first.error or {})["provider_code"],
    ) == (kind, code), first.error
    # A provider error is retried (1, 2, 4 s); the test stops the turn there.
    api.post(f"/api/v1/turns/{turn_id}/cancel")
    wait_for(
        lambda: (
            Turn.objects.get(pk=turn_id).status in ENDED
            and not InferenceCall.objects.filter(agent=agent, outcome__isnull=True).exists()
        ),
        what="the turn to end",
    )
    one_call_per_request(agent, hostile_requests())


@pytest.mark.parametrize("model", ["nul", "bad-utf8"])
def test_a_streamed_turn_whose_answer_holds_nul_succeeds_once_with_the_text_made_safe(
    api: Client,
    workers: WorkerPool,
    hostile_agent: Any,
    hostile_requests: Any,
    model: str,
) -> None:
    agent = hostile_agent(model)
    turn_id = submit(api, agent)
    wait_for(
        lambda: Turn.objects.get(pk=turn_id).status in ENDED, timeout=30, what="the turn to end"
    )
    turn = Turn.objects.get(pk=turn_id)
    assert turn.status == "succeeded", (turn.status, turn.error)
    expected = {"nul": "a\ufffdb\ufffdc", "bad-utf8": "caf\ufffd \ufffd\ufffd ok"}[model]
    answer = HistoryRow.objects.get(agent=agent, role="assistant")
    assert answer.content == [{"type": "text", "text": expected}]
    (call,) = one_call_per_request(agent, hostile_requests())
    assert call.outcome == "completed"


# --- a write that fails after the answer arrived -------------------------------------------


@pytest.fixture
def refused_rows() -> Iterator[Callable[[str, str], None]]:
    """Makes PostgreSQL refuse some rows as a data error (a trigger on the real table): the
    fault is in the database, not in the service's code."""
    made: list[str] = []

    def refuse(table: str, when: str) -> None:
        name = f"refuse_{len(made)}"
        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"RAISE EXCEPTION 'refused by the test' USING ERRCODE = '22000'; END $$"
            )
            cursor.execute(
                f"CREATE TRIGGER {name} BEFORE INSERT OR UPDATE ON {table} FOR EACH ROW "
                f"WHEN ({when}) EXECUTE FUNCTION {name}()"
            )
        made.append(f"{table}:{name}")

    yield refuse
    with connection.cursor() as cursor:
        for entry in made:
            table, name = entry.split(":")
            cursor.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
            cursor.execute(f"DROP FUNCTION IF EXISTS {name}()")


@pytest.mark.parametrize("note_refused", [False, True], ids=["note-stored", "note-refused-too"])
def test_an_answer_that_cannot_be_stored_ends_the_turn_and_is_never_requested_again(
    api: Client,
    workers: WorkerPool,
    make_agent: Any,
    standin_requests: Any,
    refused_rows: Callable[[str, str], None],
    note_refused: bool,
) -> None:
    agent = make_agent(model="answer")
    roles = "('assistant', 'system-note')" if note_refused else "('assistant')"
    refused_rows(HistoryRow._meta.db_table, f"NEW.agent_id = {agent.pk} AND NEW.role IN {roles}")
    turn_id = submit(api, agent)
    wait_for(
        lambda: Turn.objects.get(pk=turn_id).status in ENDED, timeout=30, what="the turn to end"
    )
    turn = Turn.objects.get(pk=turn_id)
    assert turn.status == "failed" and (turn.error or {})["provider_code"] == "answer_unstorable", (
        turn.status,
        turn.error,
    )
    if note_refused:
        assert turn.note_id is None
    else:
        assert turn.note is not None and "could not be stored" in turn.note.content
    (call,) = InferenceCall.objects.filter(agent=agent)
    assert (
        call.outcome == "completed" and (call.error or {})["provider_code"] == "answer_unstorable"
    )
    # Ended, not left running: the sweep has nothing to run again (it did 43 times, before).
    assert len(standin_requests()) == 1


def test_a_call_whose_record_is_refused_keeps_its_row_and_the_turn_its_answer(
    api: Client,
    workers: WorkerPool,
    make_agent: Any,
    standin_requests: Any,
    refused_rows: Callable[[str, str], None],
) -> None:
    agent = make_agent(model="answer")
    refused_rows(
        InferenceCall._meta.db_table, f"NEW.agent_id = {agent.pk} AND NEW.stop_reason <> ''"
    )
    turn_id = submit(api, agent)
    wait_for(
        lambda: Turn.objects.get(pk=turn_id).status in ENDED, timeout=30, what="the turn to end"
    )
    assert Turn.objects.get(pk=turn_id).status == "succeeded"
    (call,) = InferenceCall.objects.filter(agent=agent)
    assert (
        call.outcome == "completed"
        and (call.error or {})["provider_code"] == "unrecorded"
        and call.sent_at
        and call.ended_at
    )
    assert "refused by the test" in (call.error or {})["message"]
    assert len(standin_requests()) == 1


# --- the drop-in endpoints ------------------------------------------------------------------


@pytest.fixture
def oai(web: str, user_token: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{web}/v1", api_key=user_token, max_retries=0, timeout=60)
    yield client
    client.close()


@pytest.mark.parametrize(
    ("model", "words"), [("status-999", "HTTP status 999"), ("html-error", "<h1>Bad Gateway</h1>")]
)
def test_a_drop_in_call_answers_a_hostile_status_or_page_in_the_sdks_error_shape(
    oai: openai.OpenAI,
    hostile_agent: Any,
    hostile_requests: Any,
    model: str,
    words: str,
) -> None:
    agent = hostile_agent(model)
    with pytest.raises(openai.InternalServerError) as raised:
        oai.chat.completions.create(model=agent.name, messages=[{"role": "user", "content": "hi"}])
    assert raised.value.response.headers["content-type"].startswith("application/json")
    assert words in str(raised.value.body), raised.value.body
    one_call_per_request(agent, hostile_requests())


BAD_NUMBERS = [
    ({"temperature": float("nan")}, "temperature", "finite"),
    ({"temperature": float("inf")}, "temperature", "finite"),
    ({"max_tokens": 2**31}, "max_tokens", "1 to 2147483647"),
    ({"max_tokens": 2**63}, "max_tokens", "64 bits"),
    ({"max_tokens": 10**400}, "max_tokens", "64 bits"),
    ({"max_tokens": 0}, "max_tokens", "1 to 2147483647"),
    ({"max_completion_tokens": 1.5}, "max_completion_tokens", "whole number"),
    ({"metadata": {"n": -(2**64)}}, "metadata.n", "64 bits"),
]


@pytest.mark.parametrize(
    ("extra", "field", "words"), BAD_NUMBERS, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD_NUMBERS)]
)
def test_a_drop_in_number_no_provider_or_column_takes_is_a_400_naming_it_and_no_call(
    web: str,
    user_token: str,
    hostile_agent: Any,
    hostile_requests: Any,
    extra: dict[str, Any],
    field: str,
    words: str,
) -> None:
    agent = hostile_agent("answer")
    body = json.dumps(
        {"model": agent.name, "messages": [{"role": "user", "content": "hi"}], **extra},
        allow_nan=True,
    )
    response = httpx.post(
        f"{web}/v1/chat/completions",
        content=body,
        headers={"Authorization": f"Bearer {user_token}", "content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and words in error["message"], error
    assert hostile_requests() == [] and not InferenceCall.objects.filter(agent=agent).exists()


def test_the_anthropic_sdk_reads_a_hostile_html_page_as_its_own_error(
    web: str, user_token: str, hostile: str, hostile_requests: Any
) -> None:
    provider = ProviderFactory.create(name="hostile-anthropic", kind="anthropic", base_url=hostile)
    agent = AgentFactory.create(provider=provider, model="html-error")
    client = anthropic.Anthropic(base_url=web, api_key=user_token, max_retries=0, timeout=30)
    with pytest.raises(anthropic.InternalServerError) as raised:
        client.messages.create(
            model=agent.name, max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    client.close()
    assert raised.value.status_code == 502 and raised.value.response.headers[
        "content-type"
    ].startswith("application/json")
    assert "<h1>Bad Gateway</h1>" in raised.value.message
    one_call_per_request(agent, hostile_requests())
