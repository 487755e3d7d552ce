"""A long-running agent through a worker and a stand-in model with a 16,000-token window
(architecture.md §5.9): it keeps answering, the rows it outgrows are set aside (or summarized)
visibly and restorably, and at most one call per episode is refused.

The turn count is ``AGENTOPS_TEST_CONTEXT_TURNS`` (default 60, enough for several episodes in the
suite's time; the 200 of the target runs with ``AGENTOPS_TEST_CONTEXT_TURNS=200``)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from django.test import Client

from agentops.models import Agent, Alert, AuditEntry, HistoryRow
from calls.compile import compile_request
from inference.models import InferenceCall, Turn
from tests.factories import HistoryRowFactory
from tests.turns.test_turns import submit, wait_turn

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("workers")]

TURNS = int(os.environ.get("AGENTOPS_TEST_CONTEXT_TURNS", "60"))
WINDOW = 16000
FILLER = (
    "The quarterly figures for the northern depot came in late again, and the shift leads "
    "would like the routing table looked at before the next cycle begins. "
)


def message(i: int) -> str:
    text = f"Message {i}. " + FILLER * 20
    return text[:2000]  # about 2 KB


def run_turns(api: Client, agent: Agent, count: int) -> None:
    for i in range(count):
        turn = wait_turn(api, submit(api, agent.name, ("alice", message(i)))["id"], timeout=60)
        assert turn["status"] == "succeeded", (i, turn)


def notes(agent: Agent, prefix: str) -> list[HistoryRow]:
    rows = HistoryRow.objects.filter(agent=agent, role="system-note").order_by("seq")
    return [r for r in rows if isinstance(r.content, str) and r.content.startswith(prefix)]


def refused(agent: Agent) -> Any:
    return InferenceCall.objects.filter(agent=agent, error__type="context_length")


def check_episodes(
    api: Client, agent: Agent, *, prefix: str, learned: int | None = WINDOW
) -> list[Alert]:
    """The common account of a run: no failed turn, one marker and one alert per episode, no
    turn with more than one refused call, the current turn never set aside, nothing lost."""
    assert not Turn.objects.filter(agent=agent).exclude(status="succeeded").exists()
    alerts = list(Alert.objects.filter(agent=agent.name, kind="context-trimmed").order_by("id"))
    assert len(alerts) >= 2, "the run never outgrew the window: too few turns"
    assert len(notes(agent, prefix)) == len(alerts)
    for turn_id in refused(agent).values_list("turn_id", flat=True):
        assert refused(agent).filter(turn_id=turn_id).count() == 1
    assert refused(agent).count() <= len(alerts)
    set_aside = HistoryRow.objects.filter(agent=agent, state="set_aside")
    assert set_aside.count() == sum(a.data["rows"] for a in alerts)
    assert set(set_aside.values_list("set_aside_reason", flat=True)) == {"context"}
    for alert in alerts:
        first = Turn.objects.get(pk=alert.data["turn"]).trigger_rows.order_by("seq").first()
        assert first is not None and max(alert.data["seqs"]) < first.seq, alert.data
    # Nothing lost: every message and answer is in the record, presented or set aside.
    assert HistoryRow.objects.filter(agent=agent, role="user").count() == TURNS
    assert HistoryRow.objects.filter(agent=agent, role="assistant").count() == TURNS
    shown = api.get(f"/api/v1/agents/{agent.name}/history?include_set_aside=true").json()
    assert sum(1 for r in shown if r["set_aside_reason"] == "context") == set_aside.count()
    context = api.get(f"/api/v1/agents/{agent.name}").json()["context"]
    # The run's account, for a reader running it with -s.
    print(
        f"{agent.model}: {TURNS} turns, {len(alerts)} episodes, {refused(agent).count()} refused "
        f"call(s), {set_aside.count()} rows set aside, context {context}"
    )
    assert context["learned"] == learned and 0 < context["used_fraction"] < 1
    return alerts


def restore_all(api: Client, agent: Agent) -> None:
    rows = list(HistoryRow.objects.filter(agent=agent, state="set_aside"))
    for row in rows:
        response = api.post(
            f"/api/v1/agents/{agent.name}/history/{row.pk}/restore",
            data="{}",
            content_type="application/json",
        )
        assert response.status_code == 200, response.content
        assert response.json()["state"] == "presented"
    assert not HistoryRow.objects.filter(agent=agent, state="set_aside").exists()
    assert AuditEntry.objects.filter(action="history.restore").count() == len(rows)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_resident_trims_its_way_through_a_small_window(
    api: Client, make_agent: Any, provider: str
) -> None:
    # No window configured: the first refusal states it (in the provider's words), and it is
    # learned.
    agent = make_agent(provider=provider, model=f"window:tokens={WINDOW}", max_tokens=1000)
    run_turns(api, agent, TURNS)
    alerts = check_episodes(api, agent, prefix="[context-trim] The ")
    assert refused(agent).count() >= 1  # the one that taught the window
    assert alerts[0].verdict == "refusal"
    marker = notes(agent, "[context-trim]")[0]
    assert FILLER[:40] not in str(marker.content)
    assert str(marker.content).endswith(f"to fit the model's window of {WINDOW} tokens.")
    assert not InferenceCall.objects.filter(agent=agent, kind="auxiliary").exists()
    restore_all(api, agent)


def test_a_summarizing_resident_keeps_a_summary_in_place_of_what_it_set_aside(
    api: Client, make_agent: Any
) -> None:
    agent = make_agent(
        model=f"window:tokens={WINDOW}",
        max_tokens=1000,
        context_window=WINDOW,
        context_policy="summarize",
    )
    run_turns(api, agent, TURNS)
    alerts = check_episodes(api, agent, prefix="[context-summary] The ", learned=None)
    assert all(a.data["summarized"] for a in alerts)
    # A configured window: the estimate acts before any call is refused.
    assert refused(agent).count() == 0
    summaries = InferenceCall.objects.filter(agent=agent, kind="auxiliary")
    assert summaries.count() == len(alerts)
    assert all(c.outcome == "completed" and c.input_tokens for c in summaries)
    primary = InferenceCall.objects.filter(agent=agent, kind="primary").count()
    assert primary == TURNS + refused(agent).count()
    newest = notes(agent, "[context-summary]")[-1]
    assert "In summary: Stand-in answer to:" in str(newest.content)
    restore_all(api, agent)


def test_a_turn_that_alone_does_not_fit_fails_saying_so_and_sets_nothing_aside(
    api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="window:tokens=1000", max_tokens=500, context_window=1000)
    first = wait_turn(api, submit(api, agent.name, ("alice", "short"))["id"])
    assert first["status"] == "succeeded", first
    # About 1,000 tokens: over the window with the answer's 500 whatever else goes.
    turn = wait_turn(api, submit(api, agent.name, ("bob", message(1) * 2))["id"], timeout=30)
    assert turn["status"] == "failed", turn
    assert "the newest turn alone" in turn["error"]["message"]
    # An estimate never fails a turn: the request went, and the provider's refusal did.
    assert turn["error"]["http_status"] == 400 and refused(agent).count() == 1
    assert not HistoryRow.objects.filter(agent=agent, state="set_aside").exists()
    note = HistoryRow.objects.filter(agent=agent, role="system-note").last()
    assert note is not None and "the newest turn alone" in str(note.content)


def texts(message: dict[str, Any]) -> list[str]:
    """A recorded message's text, block by block (an OpenAI message's string is one block)."""
    content = message["content"]
    if isinstance(content, str):
        return [content]
    return [b["text"] for b in content or [] if b.get("type") == "text"]


@pytest.mark.parametrize(
    ("provider", "policy"),
    [
        ("openai", "trim"),
        ("anthropic", "trim"),
        ("openai", "summarize"),
        ("anthropic", "summarize"),
    ],
)
def test_the_note_stands_before_the_kept_history_and_the_turn_is_the_last_thing_read(
    api: Client, make_agent: Any, standin_requests: Any, provider: str, policy: str
) -> None:
    # A new user's trial: a 400-token model configured as 1,000, six messages of ~150 tokens.
    # Every trim used to append its note after the turn's message, and the model answered it.
    # (A summary's own request needs room: that model's window is 1,000, configured as 2,000.)
    window = 400 if policy == "trim" else 1000
    agent = make_agent(
        provider=provider,
        model=f"window:tokens={window}",
        system="You are a test agent.",
        max_tokens=64,
        context_window=window * 2 if policy == "summarize" else 1000,
        context_policy=policy,
    )
    sent = [f"Message {i}. " + (FILLER * 5)[:580] for i in range(6)]
    for text in sent:
        turn = wait_turn(api, submit(api, agent.name, ("alice", text))["id"], timeout=60)
        assert turn["status"] == "succeeded", turn
        # The model answers the turn's message, not a note.
        assert turn["output"]["content"].startswith("Stand-in answer to: alice: Message "), turn
    prefix = "[context-summary]" if policy == "summarize" else "[context-trim]"
    alerts = Alert.objects.filter(agent=agent.name, kind="context-trimmed")
    assert alerts.count() >= 2, "the run never outgrew the window"
    assert all(a.data["summarized"] == (policy == "summarize") for a in alerts)
    carried_note = 0
    last_read: list[str] = []
    for request in standin_requests():
        conversation = [m for m in request["body"]["messages"] if m["role"] != "system"]
        if texts(conversation[-1])[-1].startswith("agentops: Summarize the conversation rows"):
            continue  # the summary's own call
        # Anthropic refuses a conversation that does not start with a user message.
        assert conversation[0]["role"] == "user", conversation
        assert conversation[-1]["role"] == "user", conversation
        last_read.append(texts(conversation[-1])[-1])
        notes_at = [
            (i, j)
            for i, m in enumerate(conversation)
            for j, t in enumerate(texts(m))
            if t.startswith(("[context-trim]", "[context-summary]"))
        ]
        # One note, and it is the first thing after the system prompt.
        assert notes_at in ([], [(0, 0)]), conversation
        if notes_at:
            carried_note += 1
            assert texts(conversation[0])[0].startswith(prefix)
    assert carried_note >= 2
    # Each request ends with its own turn's message (a refused one and its retry alike).
    answered = [t for i, t in enumerate(last_read) if i == 0 or t != last_read[i - 1]]
    assert answered == [f"alice: {text}" for text in sent]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_trim_that_keeps_an_answer_without_its_question_still_starts_with_the_note(
    api: Client, make_agent: Any, standin_requests: Any, provider: str
) -> None:
    # Turn A failed after a second message had come (its note lies between the messages and
    # turn B's answer): the oldest unit goes with the note, and the kept history starts with
    # B's answer. The request must still start with a user message: the trim's note.
    agent = make_agent(
        provider=provider, model="window:tokens=400", max_tokens=64, context_window=400
    )
    text = (FILLER * 3)[:400]
    for seq, participant, role, content in [
        (1, "alice", "user", f"First. {text}"),
        (2, "bob", "user", f"Second. {text}"),
        (3, "agentops", "system-note", "[inference-failed] The model call failed (server)."),
        (4, agent.participant, "assistant", f"An answer to both. {text}"),
    ]:
        HistoryRowFactory.create(
            agent=agent, seq=seq, participant=participant, role=role, content=content
        )
    turn = wait_turn(api, submit(api, agent.name, ("alice", f"Third. {text}"))["id"], timeout=60)
    assert turn["status"] == "succeeded", turn
    assert turn["output"]["content"].startswith("Stand-in answer to: alice: Third."), turn
    kept = HistoryRow.objects.filter(agent=agent, state="presented").exclude(role="system-note")
    assert kept.order_by("seq").first().role == "assistant"  # type: ignore[union-attr]
    [body] = [r["body"] for r in standin_requests()]
    conversation = [m for m in body["messages"] if m["role"] != "system"]
    assert [m["role"] for m in conversation] == ["user", "assistant", "user"]
    assert texts(conversation[0])[0].startswith("[context-trim] The 3 oldest rows")
    assert texts(conversation[-1]) == [f"alice: Third. {text}"]
    # A restored row goes back to its place: after the note, before the answer that followed it.
    second = HistoryRow.objects.get(agent=agent, seq=2)
    restored = api.post(
        f"/api/v1/agents/{agent.name}/history/{second.pk}/restore",
        data="{}",
        content_type="application/json",
    )
    assert restored.status_code == 200, restored.content
    presented = HistoryRow.objects.filter(agent=agent, state="presented").order_by("seq")
    request = compile_request(agent, presented)
    assert [m.blocks[0]["text"][:16] for m in request.messages] == [
        "[context-trim] T",
        "bob: Second. The",
        "An answer to bot",
        "alice: Third. Th",
        "Stand-in answer ",
    ]


def test_a_refusal_of_a_turn_our_estimate_fits_says_the_provider_refused_it(
    api: Client, make_agent: Any
) -> None:
    # The stand-in refuses every request as too long: the turn's 70 tokens fit the window of 300
    # as we count, so the note must not say they do not fit.
    agent = make_agent(model="context-length", max_tokens=64, context_window=300)
    turn = wait_turn(api, submit(api, agent.name, ("alice", "short"))["id"], timeout=30)
    assert turn["status"] == "failed", turn
    message = turn["error"]["message"]
    assert message.startswith("the provider refused even the newest turn alone as too long")
    assert "64 kept for the answer, against the model's window of 300 tokens" in message
    assert "does not fit" not in message
    note = HistoryRow.objects.get(agent=agent, role="system-note")
    assert message in str(note.content) and ".." not in str(note.content)
    assert not HistoryRow.objects.filter(agent=agent, state="set_aside").exists()


TOOLS = [
    {
        "name": "lookup",
        "description": "Look up",
        "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
    }
]


def test_a_tool_call_and_its_result_are_set_aside_together_or_not_at_all(
    api: Client, make_agent: Any
) -> None:
    agent = make_agent(
        model=f"window:tokens={WINDOW},tool=1", max_tokens=1000, tools=TOOLS, context_window=WINDOW
    )
    rounds = max(TURNS // 2, 30)
    for i in range(rounds):
        accepted = submit(api, agent.name, ("alice", message(i)[:1000]))
        turn = wait_turn(api, accepted["id"], timeout=60)
        assert turn["status"] == "requires_action", (i, turn)
        [tool_call] = turn["output"]["tool_calls"]
        response = api.post(
            f"/api/v1/turns/{accepted['id']}/tool_results",
            data=json.dumps(
                {"results": [{"tool_call_id": tool_call["id"], "content": message(i)[:1000]}]}
            ),
            content_type="application/json",
        )
        assert response.status_code == 202, response.content
        turn = wait_turn(api, accepted["id"], {"succeeded", "failed"}, timeout=60)
        assert turn["status"] == "succeeded", (i, turn)
    assert Alert.objects.filter(agent=agent.name, kind="context-trimmed").count() >= 2
    calls: dict[str, str] = {}
    results: dict[str, str] = {}
    for row in HistoryRow.objects.filter(agent=agent).exclude(role="system-note"):
        for block in row.content if isinstance(row.content, list) else []:
            if block.get("type") == "tool_call":
                calls[block["id"]] = row.state
            elif block.get("type") == "tool_result":
                results[block["tool_call_id"]] = row.state
    assert len(calls) == rounds and calls.keys() == results.keys()
    assert "set_aside" in calls.values()
    assert calls == results  # each pair in one state: presented together or set aside together


def test_a_summary_that_fails_falls_back_to_trim(api: Client, make_agent: Any) -> None:
    agent = make_agent(
        model=f"window:tokens={WINDOW},refuse_marker=Summarize the conversation rows",
        max_tokens=1000,
        context_window=WINDOW,
        context_policy="summarize",
    )
    run_turns(api, agent, TURNS)
    alerts = check_episodes(api, agent, prefix="[context-trim] The ", learned=None)
    assert not any(a.data["summarized"] for a in alerts)
    assert not notes(agent, "[context-summary]")
    summaries = InferenceCall.objects.filter(agent=agent, kind="auxiliary")
    assert summaries.count() == len(alerts)
    assert all(
        c.outcome == "error" and (c.error or {}).get("type") == "invalid_request" for c in summaries
    )


def test_under_fail_a_refusal_ends_the_turn_as_before_and_still_teaches_the_window(
    api: Client, make_agent: Any
) -> None:
    agent = make_agent(model="window:tokens=1000", max_tokens=100, context_policy="fail")
    first = wait_turn(api, submit(api, agent.name, ("alice", "short"))["id"])
    assert first["status"] == "succeeded", first
    turn = wait_turn(api, submit(api, agent.name, ("bob", message(1) * 3))["id"], timeout=30)
    assert turn["status"] == "failed", turn
    assert turn["error"]["type"] == "context_length" and turn["error"]["http_status"] == 400
    assert "maximum context length is 1000 tokens" in turn["error"]["message"]
    assert refused(agent).count() == 1
    assert not HistoryRow.objects.filter(agent=agent, state="set_aside").exists()
    assert not Alert.objects.filter(agent=agent.name, kind="context-trimmed").exists()
    agent.refresh_from_db()
    assert agent.context_learned_window == 1000


def test_a_provider_that_counts_denser_is_calibrated_for_and_never_refuses(
    api: Client, make_agent: Any
) -> None:
    # The provider counts twice what the estimate counts; the window is configured, so the
    # estimate, calibrated by each call's reported count, acts before any call is refused.
    agent = make_agent(
        model=f"window:tokens={WINDOW},density=2", max_tokens=1000, context_window=WINDOW
    )
    run_turns(api, agent, TURNS)
    alerts = check_episodes(api, agent, prefix="[context-trim] The ", learned=None)
    assert refused(agent).count() == 0
    # The marker's tokens are the provider's: a unit of a 2 KB message and its answer is ~1,100.
    assert all(a.data["tokens"] >= 1000 * a.data["rows"] // 2 for a in alerts)


def test_an_alternate_with_a_larger_window_serves_before_anything_is_set_aside(
    api: Client, make_agent: Any
) -> None:
    # The primary's window is configured; the alternate's is four times larger (§6.11): a
    # request over the primary's goes there as it is, and nothing is trimmed.
    agent = make_agent(model=f"window:tokens={WINDOW}", max_tokens=1000, context_window=WINDOW)
    wide = f"window:tokens={WINDOW * 4}"
    agent.fallbacks = [{"provider": "standin-openai", "model": wide, "context_window": WINDOW * 4}]
    agent.save(update_fields=["fallbacks"])
    for i in range(12):
        text = (f"Message {i}. " + FILLER * 80)[:8000]  # about 2,000 tokens
        turn = wait_turn(api, submit(api, agent.name, ("alice", text))["id"], timeout=60)
        assert turn["status"] == "succeeded", (i, turn)
    served = list(
        InferenceCall.objects.filter(agent=agent, kind="primary").values_list("model", "route")
    )
    assert served[0] == (agent.model, "primary")
    assert served[-1][0] == wide and "over its window" in served[-1][1]
    assert not refused(agent).exists()
    assert not HistoryRow.objects.filter(agent=agent, state="set_aside").exists()
    assert not notes(agent, "[context-trim]")
