"""The probe's request (architecture.md §7.3): every field of the failed request but its
messages."""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest

from agentops.models import HistoryRow
from breaker.probe_call import PROBE_FIELDS, PROBE_TEXT, probe_participant, probe_request
from calls.adapters import adapter_for
from calls.compile import compile_request
from calls.types import CompiledRequest, Message
from tests.factories import AgentFactory, HistoryRowFactory

pytestmark = pytest.mark.django_db

TOOLS = [
    {
        "name": "lookup",
        "description": "Look up",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
]


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_the_probe_keeps_every_field_of_the_failed_request_except_its_messages(kind: str) -> None:
    agent = AgentFactory.create(
        model="m-1",
        system="You are careful.",
        max_tokens=777,
        thinking_budget=512,
        stream=True,
        tools=TOOLS,
        provider__kind=kind,
    )
    HistoryRowFactory.create(agent=agent, seq=1, participant="alice", content="first")
    HistoryRowFactory.create(
        agent=agent,
        seq=2,
        participant=agent.participant,
        role=HistoryRow.Role.ASSISTANT,
        content="reply",
    )
    HistoryRowFactory.create(agent=agent, seq=3, participant="bob", content="second")
    failed = compile_request(agent, HistoryRow.objects.filter(agent=agent).order_by("seq"))
    probe = probe_request(failed, probe_participant(agent))

    adapter = adapter_for(kind)
    failed_body = adapter.build(base_url="http://x", api_key="k", request=failed).body
    probe_body = adapter.build(base_url="http://x", api_key="k", request=probe).body
    expected = {**failed_body, "stream": False}
    expected.pop("stream_options", None)  # only a streamed request asks for usage chunks
    expected.pop("messages")
    assert {k: v for k, v in probe_body.items() if k != "messages"} == expected
    user_texts = [m for m in probe_body["messages"] if m["role"] == "user"]
    assert len(user_texts) == 1
    text = user_texts[0]["content"] if kind == "openai" else user_texts[0]["content"][0]["text"]
    assert text == f"bob: {PROBE_TEXT}"


def test_the_probe_asks_as_the_newest_participant_who_is_not_the_agent() -> None:
    agent = AgentFactory.create(participant="ada")
    HistoryRowFactory.create(agent=agent, seq=1, participant="carol", content="a")
    HistoryRowFactory.create(
        agent=agent, seq=2, participant="ada", content="b"
    )  # the agent's own name
    assert probe_participant(agent) == "carol"


@pytest.mark.parametrize(
    ("agent_participant", "asked_as"), [("ada", "User"), ("User", "Operator"), ("user", "Operator")]
)
def test_with_no_other_participant_the_probe_asks_as_one_that_is_not_the_agents(
    agent_participant: str, asked_as: str
) -> None:
    agent = AgentFactory.create(participant=agent_participant)
    assert probe_participant(agent) == asked_as


def test_every_field_of_the_request_has_a_place_in_the_probe_table() -> None:
    assert set(PROBE_FIELDS) == {f.name for f in fields(CompiledRequest)}
    assert {name for name, what in PROBE_FIELDS.items() if what == "replaced"} == {
        "messages",
        "stream",
    }


def test_the_probe_keeps_every_kept_field_and_replaces_only_the_messages_and_streaming() -> None:
    failed = CompiledRequest(
        model="m-9",
        system="Be brief.",
        max_tokens=321,
        stream=True,
        thinking_budget=1024,
        tools=TOOLS,
        messages=[
            Message(role="user", blocks=[{"type": "text", "text": "alice: hi"}]),
            Message(role="assistant", blocks=[{"type": "text", "text": "yo"}]),
        ],
    )
    assert all(
        getattr(failed, f.name) != f.default
        for f in fields(CompiledRequest)
        if f.default is not MISSING
    )  # every field set
    probe = probe_request(failed, "alice")
    for name, what in PROBE_FIELDS.items():
        if what == "kept":
            assert getattr(probe, name) == getattr(failed, name), name
    assert probe.stream is False
    assert probe.messages == [
        Message(role="user", blocks=[{"type": "text", "text": f"alice: {PROBE_TEXT}"}])
    ]


def test_an_agent_presented_as_user_is_never_who_the_probe_asks_as() -> None:
    agent = AgentFactory.create(participant="User")
    HistoryRowFactory.create(agent=agent, seq=1, participant="sam", content="a")
    HistoryRowFactory.create(
        agent=agent, seq=2, participant="User", role=HistoryRow.Role.ASSISTANT, content="b"
    )
    HistoryRowFactory.create(
        agent=agent, seq=3, participant="User", content="c"
    )  # the agent's own name on a user row
    assert probe_participant(agent) == "sam"
    failed = compile_request(agent, HistoryRow.objects.filter(agent=agent).order_by("seq"))
    [message] = probe_request(failed, probe_participant(agent)).messages
    assert message.blocks == [{"type": "text", "text": f"sam: {PROBE_TEXT}"}]
