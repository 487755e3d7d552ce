"""A pending act can never poison the journal (architecture.md §6.5): an act the database refuses
for its own data (not because the database is failing) is dropped with a log line and an alert, and
the acts behind it are recorded as usual, in the same process."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agentops.models import Agent, Alert
from waits.admission import admission_check
from waits.journal import journal_pending
from waits.models import WaitJournalEntry
from waits.services import wait_record, wait_release

from .conftest import NOW

pytestmark = pytest.mark.django_db

# 22021 character_not_in_repertoire: what PostgreSQL answers for text it cannot store.
UNSTORABLE = "22021"


def test_an_act_refused_for_its_data_is_dropped_with_an_alert_and_the_next_act_is_recorded(
    agent: Agent, refuse_writes: Callable[..., None], caplog: pytest.LogCaptureFixture
) -> None:
    refuse_writes(UNSTORABLE, when="NEW.model = 'm1'")
    dropped = wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    assert dropped.receipt == "pending"
    assert journal_pending() == []  # not kept: no retry can mend it
    [alert] = Alert.objects.filter(kind="journal-act-dropped")
    assert (alert.agent, alert.model) == ("ada", "m1") and "dropped" in alert.message
    assert any("was dropped" in r.getMessage() and r.levelname == "ERROR" for r in caplog.records)
    later = wait_record(
        agent=agent, model="m2", retry_after_ms=600_000, reason="429", now_ms=NOW + 1
    )
    assert later.receipt == "recorded"
    assert list(WaitJournalEntry.objects.values_list("model", flat=True)) == ["m2"]
    assert admission_check(agent=agent, model="m2", now_ms=NOW + 2) is not None


def test_a_pending_act_that_turns_out_unstorable_stops_blocking_the_acts_behind_it(
    agent: Agent, refuse_writes: Callable[..., None]
) -> None:
    refuse_writes("08006")  # the database is failing: the act stays pending
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    assert len(journal_pending()) == 1
    refuse_writes(UNSTORABLE, when="NEW.model = 'm1'")  # now its own data is refused
    receipts = wait_release(
        agent="ada", model="m3", reason="ok", via="api", requester="ops", now_ms=NOW + 1
    )
    assert [r.release for r in receipts] == []
    assert journal_pending() == []
    assert list(WaitJournalEntry.objects.values_list("kind", "model")) == [("release", "m3")]
    assert Alert.objects.filter(kind="journal-act-dropped").count() == 1


def test_a_transient_failure_still_keeps_the_act_pending(
    agent: Agent, refuse_writes: Callable[..., None]
) -> None:
    refuse_writes("40001")
    wait_record(agent=agent, model="m1", retry_after_ms=600_000, reason="429", now_ms=NOW)
    assert (
        len(journal_pending()) == 1
        and not Alert.objects.filter(kind="journal-act-dropped").exists()
    )


def test_a_lone_surrogate_in_a_providers_reason_is_stored_replaced_not_refused(
    agent: Agent,
) -> None:
    result = wait_record(
        agent=agent, model="m1", retry_after_ms=600_000, reason="bad \ud800 text", now_ms=NOW
    )
    assert result.receipt == "recorded" and journal_pending() == []
    assert WaitJournalEntry.objects.get().reason == "bad \ufffd text"
