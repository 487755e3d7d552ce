"""Things that move while the probe is out, through a real worker and the stand-in
(architecture.md §7.3): the probe's answer is set aside, nothing is shed, no retry is queued, and
the next failure probes again.

The stand-in plays a sequence per agent: three refused requests, then the probe, answered
slowly so the test can move something while it is out, then refusals again (so the next
failure's probe is refused and the run settles with a ``history-kept`` alert)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

import pytest
from django.test import Client
from django.utils import timezone

from agentops.models import Agent, Alert, HistoryRow
from breaker.models import BreakerState
from breaker.services import breaker_note_failure, breaker_note_success
from inference.models import InferenceCall, Turn
from tests.breaker.test_live import alerts, fail_in_a_row
from tests.conftest import wait_for
from tests.factories import TurnFactory
from tests.turns.test_turns import submit

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("workers")]

PROBE_DELAY_MS = 3000


def sequence(*steps: str) -> str:
    """A stand-in ``sequence`` scenario: the n-th request plays step n, the last repeats."""
    return "sequence:steps=" + "|".join(quote(step, safe="") for step in steps)


SLOW_PROBE = sequence("refuse", "refuse", "refuse", f"answer:delay_ms={PROBE_DELAY_MS}", "refuse")
HANGING_PROBE = sequence("refuse", "refuse", "refuse", "hang", "refuse")


def probes(agent: Agent) -> Any:
    return InferenceCall.objects.filter(agent=agent, kind="probe").order_by("id")


def probe_out(agent: Agent, number: int = 1) -> InferenceCall:
    call: InferenceCall = wait_for(
        lambda: (
            probes(agent).filter(outcome__isnull=True).count() == 1
            and probes(agent).count() == number
            and probes(agent).last()
        ),
        what=f"probe {number} to go out",
    )
    return call


def probe_status(agent: Agent) -> str:
    return str(BreakerState.objects.values_list("probe_status", flat=True).get(agent=agent))


def three_failures_then_probe_out(api: Client, agent: Agent) -> InferenceCall:
    # The third failure's probe goes out at once: do not wait for the breaker to settle.
    fail_in_a_row(api, agent, 3)
    return probe_out(agent)


def nothing_shed(agent: Agent) -> None:
    assert not HistoryRow.objects.filter(agent=agent, state="set_aside").exists()
    notes = HistoryRow.objects.filter(agent=agent, role="system-note").values_list(
        "content", flat=True
    )
    assert not [n for n in notes if str(n).startswith("[refusal-rewind]")]
    assert BreakerState.objects.get(agent=agent).sheds_this_run == 0


def next_failure_probes_again(api: Client, agent: Agent, *, submit_one: bool) -> None:
    """The next failure decides afresh: a second probe, refused by the stand-in, so the run
    ends with a refused ``history-kept`` alert and still nothing shed."""
    if submit_one:
        submit(api, agent.name, ("alice", "after the probe"))
    wait_for(
        lambda: (
            probes(agent).count() == 2 and probes(agent).filter(outcome__isnull=True).count() == 0
        ),
        what="a second probe",
    )
    wait_for(lambda: probe_status(agent) == "refused", what="the second probe's verdict")
    assert (
        Alert.objects.filter(kind="history-kept", agent=agent.name, verdict="refused").count() == 1
    )
    nothing_shed(agent)


def _store_a_message(api: Client, agent: Agent) -> bool:
    submit(api, agent.name, ("bob", "meanwhile, a message"))
    return False  # its own turn is the next failure


def _edit_a_row(api: Client, agent: Agent) -> bool:
    HistoryRow.objects.filter(agent=agent, seq=1).update(
        content="message 1, edited", edited_at=timezone.now()
    )
    return True


def _move_the_streak_and_back(api: Client, agent: Agent) -> bool:
    streak = BreakerState.objects.get(agent=agent).streak
    breaker_note_success(agent=agent)
    for _ in range(streak):
        breaker_note_failure(agent=agent, failure_type="server", http_status=500)
    assert BreakerState.objects.get(agent=agent).streak == streak
    return True


def _start_another_turn(api: Client, agent: Agent) -> bool:
    TurnFactory.create(agent=agent, status=Turn.Status.QUEUED)
    return False  # the drain runs it once the probe is done: the next failure


MOVES: dict[str, tuple[Callable[[Client, Agent], bool], str]] = {
    "a message stored": (_store_a_message, "a history row was added"),
    "a row edited": (_edit_a_row, "a history row was edited"),
    "the streak moved and moved back": (_move_the_streak_and_back, "withdrawn"),
    "another turn started": (_start_another_turn, "another turn started"),
}


@pytest.mark.parametrize("move", list(MOVES))
def test_an_answer_that_comes_back_after_something_moved_is_set_aside_and_the_next_failure_probes_again(
    api: Client,
    make_agent: Any,
    move: str,
) -> None:
    agent = make_agent(model=SLOW_PROBE)
    act, reason = MOVES[move]
    three_failures_then_probe_out(api, agent)
    submit_next = act(api, agent)
    first = wait_for(
        lambda: probes(agent).first().outcome is not None and probes(agent).first(),
        timeout=15,
        what="the probe to end",
    )
    wait_for(lambda: probe_status(agent) != "out", what="the breaker to read the probe")
    state = BreakerState.objects.get(agent=agent)
    if reason == "withdrawn":
        # A completed call and later failures withdraw the probe: its call is aborted.
        assert first.outcome == "aborted"
        assert state.probe_status in (
            "withdrawn",
            "refused",
        )  # refused once the next failure probed
    else:
        assert first.outcome == "completed"  # the probe was answered...
        wait_for(
            lambda: (
                "set aside" in BreakerState.objects.get(agent=agent).probe_verdict
                or probes(agent).count() == 2
            ),
            what="the answer to be set aside",
        )
    nothing_shed(agent)
    # The answer decided nothing: no retry was queued for it.
    assert not Alert.objects.filter(
        kind="history-kept", agent=agent.name, verdict="unclear"
    ).exists()
    next_failure_probes_again(api, agent, submit_one=submit_next)
    assert Turn.objects.filter(agent=agent, status="succeeded").count() == 0


def test_an_answer_set_aside_says_why_in_the_breaker(api: Client, make_agent: Any) -> None:
    agent = make_agent(model=SLOW_PROBE)
    three_failures_then_probe_out(api, agent)
    HistoryRow.objects.filter(agent=agent, seq=2).update(content="edited", edited_at=timezone.now())
    wait_for(
        lambda: probe_status(agent) == "set_aside", timeout=15, what="the answer to be set aside"
    )
    breaker = api.get(f"/api/v1/agents/{agent.name}/breaker").json()
    assert breaker["probe"]["status"] == "set_aside"
    assert "a history row was edited while the probe was out" in breaker["probe"]["verdict"]
    assert breaker["set_aside"] == [] and breaker["sheds_this_run"] == 0
    assert Turn.objects.filter(agent=agent).count() == 3  # no retry turn
    nothing_shed(agent)


def test_removing_the_agent_withdraws_its_probe_and_aborts_the_call(
    api: Client, make_agent: Any
) -> None:
    agent = make_agent(model=HANGING_PROBE, kind=Agent.Kind.CONVERSATION)
    three_failures_then_probe_out(api, agent)
    response = api.delete(f"/api/v1/agents/{agent.name}")
    assert response.status_code == 204, response.content
    # The stand-in never answers this probe: only the withdrawal ends its call.
    call = wait_for(
        lambda: probes(agent).first().outcome is not None and probes(agent).first(),
        timeout=10,
        what="the probe's call to be aborted",
    )
    assert call.outcome == "aborted"
    wait_for(
        lambda: not InferenceCall.objects.filter(agent=agent, outcome__isnull=True).exists(),
        what="no call out",
    )
    state = BreakerState.objects.get(agent=agent)
    assert state.probe_status == "withdrawn" and "the agent was removed" in state.probe_verdict
    nothing_shed(agent)
    assert Turn.objects.filter(agent=agent).count() == 3
    assert alerts(agent, "history-kept") == 0
    assert api.get(f"/api/v1/agents/{agent.name}").status_code == 404
