"""The breaker through a real worker and the stand-in (architecture.md §7)."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from django.test import Client

from agentops.models import Alert, HistoryRow
from breaker.models import BreakerState
from inference.models import InferenceCall, Turn
from tests.conftest import wait_for
from tests.factories import HistoryRowFactory
from tests.turns.test_turns import submit, wait_turn

TOOLS = [
    {
        "name": "lookup",
        "description": "Look up",
        "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
]

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("workers")]


def fail_in_a_row(api: Client, agent: Any, count: int, *, settled: Any = None) -> None:
    """Submit ``count`` messages one at a time, each after the last turn failed and the breaker
    finished with it (``settled(i)`` says when; a message sent while a probe is out would move
    the history and set the probe's answer aside)."""
    for i in range(count):
        turn = wait_turn(api, submit(api, agent.name, ("alice", f"message {i + 1}"))["id"])
        assert turn["status"] == "failed", turn
        wait_for(partial(streak_reached, agent, i + 1), what="the streak")
        if settled is not None:
            wait_for(partial(settled, i), what="the breaker to finish")


def streak_reached(agent: Any, streak: int) -> bool:
    return BreakerState.objects.filter(agent=agent, streak__gte=streak).exists()


def alerts(agent: Any, kind: str) -> int:
    return Alert.objects.filter(kind=kind, agent=agent.name).count()


def test_a_request_refused_without_its_history_too_keeps_the_history(
    api: Client, make_agent: Any, standin_requests: Any
) -> None:
    agent = make_agent(
        model="refuse", system="Be brief.", max_tokens=321, thinking_budget=1024, tools=TOOLS
    )
    # Probes from the 3rd failure on.
    kept = lambda i: alerts(agent, "history-kept") == max(i - 1, 0)  # noqa: E731
    fail_in_a_row(api, agent, 3, settled=kept)
    probes = InferenceCall.objects.filter(agent=agent, kind="probe")
    assert probes.count() == 1
    *_, failed, probe = standin_requests()
    probe_body = probe["body"]
    assert probe_body["messages"][-1]["content"] == "alice: Reply with one word."
    # On the wire: every field of the failed request but its messages, and not streamed.
    assert probe_body["stream"] is False and failed["body"]["stream"] is True
    unstreamed = {
        k: v for k, v in failed["body"].items() if k not in ("messages", "stream", "stream_options")
    }
    assert {k: v for k, v in probe_body.items() if k not in ("messages", "stream")} == unstreamed
    assert [m for m in probe_body["messages"] if m["role"] != "system"] == [
        {"role": "user", "content": "alice: Reply with one word."}
    ]
    assert not HistoryRow.objects.filter(agent=agent, state="set_aside").exists()
    assert HistoryRow.objects.filter(agent=agent, role="user", state="presented").count() == 3
    [alert] = Alert.objects.filter(kind="history-kept", agent=agent.name)
    assert alert.verdict == "refused"
    assert (
        "fails without its history too" in alert.message
        and "no retry was queued" in alert.message.lower()
    )
    breaker = api.get(f"/api/v1/agents/{agent.name}/breaker").json()
    assert breaker["streak"] == 3 and breaker["sheds_this_run"] == 0 and breaker["set_aside"] == []

    fail_in_a_row(api, agent, 2, settled=lambda i: alerts(agent, "history-kept") == i + 2)
    assert InferenceCall.objects.filter(agent=agent, kind="probe").count() == 3
    assert Alert.objects.filter(kind="history-kept", agent=agent.name).count() == 3
    assert not HistoryRow.objects.filter(agent=agent, state="set_aside").exists()
    assert Alert.objects.filter(kind="hard-down", agent=agent.name).count() == 3


def test_a_poisoned_history_is_shed_until_the_retry_succeeds(api: Client, make_agent: Any) -> None:
    agent = make_agent(model="poison")
    first = wait_turn(api, submit(api, agent.name, ("alice", "this carries POISON"))["id"])
    assert first["status"] == "failed"
    # The poisoned row is still presented: failures 2 and 3. Failure 3 probes (answered: the
    # probe carries no history), sheds the newest turn and retries; the retries shed one more
    # turn each until the poisoned row is set aside.
    fail_in_a_row(api, agent, 2)
    wait_for(
        lambda: Turn.objects.filter(agent=agent, status="succeeded").exists(),
        timeout=30,
        what="a retry to succeed",
    )
    assert InferenceCall.objects.filter(agent=agent, kind="probe").count() == 1
    set_aside = HistoryRow.objects.filter(agent=agent, state="set_aside").order_by("seq")
    assert [r.content for r in set_aside] == ["this carries POISON", "message 1", "message 2"]
    notes = HistoryRow.objects.filter(agent=agent, role="system-note").values_list(
        "content", flat=True
    )
    markers = [n for n in notes if str(n).startswith("[refusal-rewind]")]
    assert len(markers) == 1 and markers[0].startswith(
        "[refusal-rewind] The 3 most recent turn(s) were set aside"
    )
    assert "POISON" not in markers[0]
    assert api.get(f"/api/v1/agents/{agent.name}").json()["failure_streak"] == 0


@pytest.mark.parametrize("model", ["auth", "context-length", "error:status=404", "length-empty"])
def test_a_failure_that_may_not_shed_sends_no_probe_but_still_raises_hard_down(
    api: Client, make_agent: Any, model: str
) -> None:
    # context_policy "fail": the breaker's own behaviour (a resident would trim, §5.9).
    agent = make_agent(model=model, context_policy="fail")
    fail_in_a_row(api, agent, 3)
    wait_for(lambda: alerts(agent, "hard-down") == 1, what="hard-down")
    assert not InferenceCall.objects.filter(agent=agent, kind="probe").exists()
    assert not HistoryRow.objects.filter(agent=agent, state="set_aside").exists()
    assert alerts(agent, "hard-down") == 1


def test_the_cap_stops_shedding_and_a_completed_turn_starts_a_run_that_probes_again(
    api: Client, make_agent: Any
) -> None:
    from tests.breaker.test_live_moves import sequence

    # Three refusals, the probe answered, three refused retries (the third at the cap), a
    # completed turn, then a new run: three refusals and its own probe, refused.
    steps = ["refuse"] * 3 + ["answer"] + ["refuse"] * 3 + ["answer"] + ["refuse"] * 4
    agent = make_agent(model=sequence(*steps))
    # An older message never answered: after three sheds something is left to answer (with
    # only notes left, the retry would end without a call, §5.8), so the third retry is refused.
    HistoryRowFactory.create(agent=agent, seq=1, content="message 0")
    fail_in_a_row(api, agent, 3)
    wait_for(
        lambda: (
            streak_reached(agent, 6)
            and not Turn.objects.filter(agent=agent, status__in=["queued", "running"]).exists()
        ),
        what="the retries to run out at the cap",
    )
    state = BreakerState.objects.get(agent=agent)
    assert state.sheds_this_run == 3
    set_aside = HistoryRow.objects.filter(agent=agent, state="set_aside").order_by("seq")
    assert [r.content for r in set_aside] == ["message 1", "message 2", "message 3"]
    notes = HistoryRow.objects.filter(agent=agent, role="system-note").values_list(
        "content", flat=True
    )
    markers = [str(n) for n in notes if str(n).startswith("[refusal-rewind]")]
    assert len(markers) == 1 and markers[0].startswith(
        "[refusal-rewind] The 3 most recent turn(s) were set aside"
    )
    assert (
        Turn.objects.filter(agent=agent).count() == 6
    )  # three messages and three retries, none after the cap
    last_hard_down = Alert.objects.filter(kind="hard-down", agent=agent.name).order_by("-id")[0]
    assert "its cap" in last_hard_down.message
    assert InferenceCall.objects.filter(agent=agent, kind="probe").count() == 1

    done = wait_turn(api, submit(api, agent.name, ("alice", "message 4"))["id"])
    assert done["status"] == "succeeded"
    assert BreakerState.objects.get(agent=agent).streak == 0
    fail_in_a_row(api, agent, 3)
    wait_for(lambda: alerts(agent, "history-kept") == 1, what="the new run's probe to be read")
    assert InferenceCall.objects.filter(agent=agent, kind="probe").count() == 2
    assert Alert.objects.get(kind="history-kept", agent=agent.name).verdict == "refused"
    assert (
        HistoryRow.objects.filter(agent=agent, state="set_aside").count() == 3
    )  # the new run shed nothing
