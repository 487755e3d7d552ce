"""The write services: the provider-wait alert (architecture.md §6.7) and the release service
(§6.8)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from agentops.exceptions import BadRequest, NotFound
from agentops.models import Agent, Alert, AuditEntry
from tests.factories import AgentFactory
from waits.admission import admission_check
from waits.models import WaitJournalEntry
from waits.services import wait_record, wait_release

from .conftest import NOW

pytestmark = pytest.mark.django_db
HOUR = 3_600_000


def wait_alerts(agent: Agent) -> list[Alert]:
    return list(Alert.objects.filter(kind="provider-wait", agent=agent.name).order_by("id"))


# --- alerts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stated", "end"),
    [
        (24 * HOUR, "until 2027-01-16 08:00:00 UTC (1 d from now)"),
        (1e20, "until released"),
        (math.nan, "until released"),
    ],
)
def test_a_long_or_indefinite_wait_raises_one_alert_even_when_recorded_twice(
    agent: Agent, stated: float, end: str
) -> None:
    first = wait_record(
        agent=agent, model="m1", retry_after_ms=stated, reason="429 quota window", now_ms=NOW
    )
    again = wait_record(
        agent=agent, model="m1", retry_after_ms=stated, reason="429 quota window", now_ms=NOW
    )
    later = wait_record(
        agent=agent, model="m1", retry_after_ms=stated, reason="429 quota window", now_ms=NOW + 1000
    )
    assert (first.alerted, again.alerted, later.alerted) == (True, False, False)
    alerts = wait_alerts(agent)
    assert len(alerts) == 1
    message = alerts[0].message
    for part in (
        "ada",
        "m1",
        end,
        "POST /api/v1/waits/release",
        "Binding waits",
        "python manage.py release_wait ada --model m1",
    ):
        assert part in message
    assert alerts[0].model == "m1"


@pytest.mark.parametrize("stated", [60_000, HOUR, -1000, 0])
def test_pacing_waits_raise_no_alert(agent: Agent, stated: float) -> None:
    wait_record(agent=agent, model="m1", retry_after_ms=stated, reason="429", now_ms=NOW)
    wait_record(agent=agent, model="m1", retry_after_ms=stated, reason="429", now_ms=NOW)
    assert wait_alerts(agent) == []


def test_a_millisecond_over_the_alert_setting_alerts(agent: Agent, settings: Any) -> None:
    settings.AGENTOPS_WAIT_ALERT_MS = 1000
    assert not wait_record(
        agent=agent, model="m1", retry_after_ms=1000, reason="429", now_ms=NOW
    ).alerted
    assert wait_record(
        agent=agent, model="m2", retry_after_ms=1001, reason="429", now_ms=NOW
    ).alerted


def test_a_pacing_wait_that_grows_into_a_long_hold_alerts_and_an_indefinite_one_alerts_again(
    agent: Agent,
) -> None:
    assert not wait_record(
        agent=agent, model="m1", retry_after_ms=HOUR / 2, reason="429", now_ms=NOW
    ).alerted
    assert wait_record(
        agent=agent, model="m1", retry_after_ms=2 * HOUR, reason="429", now_ms=NOW
    ).alerted
    assert wait_record(
        agent=agent, model="m1", retry_after_ms=math.inf, reason="429", now_ms=NOW
    ).alerted
    assert not wait_record(
        agent=agent, model="m1", retry_after_ms=math.nan, reason="429", now_ms=NOW + 5
    ).alerted
    assert len(wait_alerts(agent)) == 2


def test_a_re_hold_that_ends_no_later_than_a_second_after_the_alerted_hold_raises_no_new_alert(
    agent: Agent,
) -> None:
    """The provider restating the same window (its Retry-After counting down) is one hold."""
    assert wait_record(
        agent=agent, model="m1", retry_after_ms=2 * HOUR, reason="429", now_ms=NOW
    ).alerted
    for step in range(
        1, 5
    ):  # four re-holds in seven minutes, each ending within a second of the first
        now = NOW + step * 105_000
        assert not wait_record(
            agent=agent,
            model="m1",
            retry_after_ms=2 * HOUR - step * 105_000 + 999,
            reason="429",
            now_ms=now,
        ).alerted
    assert not wait_record(
        agent=agent, model="m1", retry_after_ms=HOUR + 1, reason="429", now_ms=NOW + 420_000
    ).alerted
    assert len(wait_alerts(agent)) == 1


def test_a_re_hold_that_ends_later_than_the_alerted_hold_alerts_with_the_new_end(
    agent: Agent,
) -> None:
    assert wait_record(
        agent=agent, model="m1", retry_after_ms=2 * HOUR, reason="429", now_ms=NOW
    ).alerted
    assert wait_record(
        agent=agent, model="m1", retry_after_ms=2 * HOUR, reason="429", now_ms=NOW + 1002
    ).alerted
    alerts = wait_alerts(agent)
    assert len(alerts) == 2
    assert alerts[1].data["until_ms"] == NOW + 1002 + 2 * HOUR


def test_a_long_hold_after_the_alerted_one_ended_alerts_again(agent: Agent) -> None:
    assert wait_record(
        agent=agent, model="m1", retry_after_ms=2 * HOUR, reason="429", now_ms=NOW
    ).alerted
    assert wait_record(
        agent=agent, model="m1", retry_after_ms=2 * HOUR, reason="429", now_ms=NOW + 2 * HOUR
    ).alerted
    assert len(wait_alerts(agent)) == 2


def test_each_model_gets_its_own_alert(agent: Agent) -> None:
    assert wait_record(
        agent=agent, model="m1", retry_after_ms=2 * HOUR, reason="429", now_ms=NOW
    ).alerted
    assert wait_record(
        agent=agent, model="m2", retry_after_ms=2 * HOUR, reason="429", now_ms=NOW
    ).alerted


def test_an_alert_words_the_stated_wait_and_its_end_as_people_read_them(agent: Agent) -> None:
    wait_record(agent=agent, model="m1", retry_after_ms=7_200_000, reason="429", now_ms=NOW)
    message = wait_alerts(agent)[0].message
    assert "until 2027-01-15 10:00:00 UTC (2 h from now)" in message
    assert "the provider asked to wait 2 h " in message
    assert "e+0" not in message and "7.2" not in message


def test_a_new_long_wait_after_a_release_alerts_again(agent: Agent) -> None:
    wait_record(agent=agent, model="m1", retry_after_ms=24 * HOUR, reason="429", now_ms=NOW)
    wait_release(agent="ada", model="m1", reason="ok", via="api", requester="ops", now_ms=NOW + 1)
    assert wait_record(
        agent=agent, model="m1", retry_after_ms=24 * HOUR, reason="429", now_ms=NOW + 2
    ).alerted
    assert len(wait_alerts(agent)) == 2


def test_a_wait_reason_has_its_control_characters_turned_into_spaces(agent: Agent) -> None:
    wait_record(
        agent=agent, model="m1", retry_after_ms=1000, reason="slow\r\ndown\x1b[31m", now_ms=NOW
    )
    assert WaitJournalEntry.objects.get().reason == "slow  down [31m"


def test_a_model_that_is_not_a_name_is_a_programming_error(agent: Agent) -> None:
    for model in ("", "*", "m\n1"):
        with pytest.raises(ValueError):
            wait_record(agent=agent, model=model, retry_after_ms=1000, reason="429", now_ms=NOW)
    assert not WaitJournalEntry.objects.exists()


# --- release --------------------------------------------------------------------------------


@pytest.fixture
def held_agent(agent: Agent) -> Agent:
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    wait_record(agent=agent, model="m2", retry_after_ms=math.nan, reason="429", now_ms=NOW)
    return agent


@pytest.mark.parametrize("model", [None, "*"])
def test_omitted_or_star_model_releases_every_model(held_agent: Agent, model: str | None) -> None:
    receipts = wait_release(
        agent="ada",
        model=model,
        requester="ops",
        reason="provider fixed",
        via="api",
        now_ms=NOW + 1,
    )
    assert [(r.agent, r.model, r.until_ms, r.release) for r in receipts] == [
        ("ada", "m1", NOW + 600_000, "recorded"),
        ("ada", "m2", None, "recorded"),
    ]
    assert admission_check(agent=held_agent, model="m1", now_ms=NOW + 2) is None
    assert admission_check(agent=held_agent, model="m2", now_ms=NOW + 2) is None
    assert WaitJournalEntry.objects.filter(kind="release").get().model == "*"


def test_a_release_of_one_model_leaves_the_others(held_agent: Agent) -> None:
    receipts = wait_release(
        agent="ada", model="m2", reason="ok", via="api", requester="ops", now_ms=NOW + 1
    )
    assert [(r.model, r.release) for r in receipts] == [("m2", "recorded")]
    assert admission_check(agent=held_agent, model="m1", now_ms=NOW + 2) is not None


def test_a_release_writes_an_audit_entry_with_requester_reason_and_receipts(
    held_agent: Agent,
) -> None:
    wait_release(
        agent="ada",
        model="m1",
        requester="ops\x1b[2J" + "x" * 300,
        reason="provider\nfixed it",
        via="api",
        now_ms=NOW + 1,
    )
    entry = AuditEntry.objects.get(action="wait.release")
    assert entry.actor == "api:ops [2J" + "x" * 193
    assert (entry.target, entry.reason) == ("ada/m1", "provider fixed it")
    assert entry.data["requester"] == "ops [2J" + "x" * 193
    assert entry.data["receipts"] == [
        {"agent": "ada", "model": "m1", "until": "2027-01-15T08:10:00+00:00", "release": "recorded"}
    ]
    assert WaitJournalEntry.objects.get(kind="release").by == entry.actor


@pytest.mark.parametrize(
    ("via", "kwargs", "actor"),
    [
        ("api", {"requester": "ci-bot"}, "api:ci-bot"),
        ("admin", {"username": "grace"}, "admin:grace"),
        ("command", {"requester": "root"}, "command:root"),
    ],
)
def test_each_surface_records_who_released(
    held_agent: Agent, via: str, kwargs: dict[str, str], actor: str
) -> None:
    wait_release(agent="ada", reason="ok", via=via, now_ms=NOW + 1, **kwargs)
    assert AuditEntry.objects.get().actor == actor


def test_a_release_with_nothing_binding_is_still_recorded_and_audited(agent: Agent) -> None:
    assert (
        wait_release(
            agent="ada", model="m9", reason="just in case", via="api", requester="ops", now_ms=NOW
        )
        == []
    )
    assert WaitJournalEntry.objects.filter(kind="release").count() == 1
    assert AuditEntry.objects.count() == 1


def test_an_expired_wait_is_not_listed_as_lifted(agent: Agent) -> None:
    wait_record(agent=agent, model="m1", retry_after_ms=1000, reason="429", now_ms=NOW)
    assert (
        wait_release(agent="ada", reason="ok", via="api", requester="ops", now_ms=NOW + 1000) == []
    )


def test_an_unknown_agent_is_not_found_and_nothing_changes(agent: Agent) -> None:
    for name in ("nobody", "*", "framework"):
        with pytest.raises(NotFound):
            wait_release(agent=name, reason="?", via="api", requester="ops", now_ms=NOW)
    assert not WaitJournalEntry.objects.exists() and not AuditEntry.objects.exists()


def test_a_disposed_agent_can_be_released_while_a_wait_is_listed_for_it(agent: Agent) -> None:
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    Agent.objects.filter(pk=agent.pk).update(disposed_at="2027-01-15T08:00:00Z")
    assert [
        r.model
        for r in wait_release(agent="ada", reason="ok", via="api", requester="ops", now_ms=NOW + 1)
    ] == ["m1"]
    with pytest.raises(NotFound):
        wait_release(agent="ada", reason="again", via="api", requester="ops", now_ms=NOW + 2)


INVALID: list[tuple[str, dict[str, Any]]] = [
    ("model", {"model": ""}),
    ("model", {"model": "   "}),
    ("model", {"model": 5}),
    ("model", {"model": 1.5}),
    ("model", {"model": True}),
    ("model", {"model": ["m1"]}),
    ("model", {"model": {"name": "m1"}}),
    ("model", {"model": "m1\x00"}),
    ("model", {"model": "m1\nm2"}),
    ("model", {"model": "m\u2028"}),
    ("model", {"model": "m" * 201}),
    ("agent", {"agent": ""}),
    ("agent", {"agent": 5}),
    ("agent", {"agent": None}),
    ("agent", {"agent": ["ada"]}),
    ("agent", {"agent": "ada\x07"}),
    ("requester", {"requester": 5}),
    ("reason", {"reason": ["why"]}),
]


@pytest.mark.parametrize(("field", "change"), INVALID)
def test_an_invalid_release_is_refused_naming_the_field_and_changes_nothing(
    held_agent: Agent, field: str, change: dict[str, Any]
) -> None:
    rows = WaitJournalEntry.objects.count()
    arguments: dict[str, Any] = {
        "agent": "ada",
        "model": "m1",
        "requester": "ops",
        "reason": "ok",
        **change,
    }
    with pytest.raises(BadRequest) as refused:
        wait_release(via="api", now_ms=NOW + 1, **arguments)
    assert refused.value.data["field"] == field
    assert refused.value.message.startswith(f"{field}: ")
    assert WaitJournalEntry.objects.count() == rows
    assert not AuditEntry.objects.exists()
    assert admission_check(agent=held_agent, model="m1", now_ms=NOW + 2) is not None


def test_a_release_never_lengthens_a_hold(agent: Agent) -> None:
    other: Agent = AgentFactory.create(name="bob")
    wait_record(agent=agent, model="m1", retry_after_ms=1000, reason="429", now_ms=NOW)
    wait_release(agent="bob", reason="ok", via="api", requester="ops", now_ms=NOW + 1)
    hold = admission_check(agent=agent, model="m1", now_ms=NOW + 1)
    assert hold is not None and hold.until_ms == NOW + 1000
    assert admission_check(agent=other, model="m1", now_ms=NOW + 1) is None
