"""Fail closed without a window (architecture.md §6.5; issue 12, test 6): a check made while another
thread's poll is reading an unreadable row refuses; it does not answer from the view read
before, however old."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

from agentops.models import Agent
from waits.admission import admission_check
from waits.journal import JOURNAL_POLL_MS, journal_binding

from .conftest import NOW, insert_row


@pytest.mark.django_db(transaction=True)
def test_a_check_racing_a_poll_that_sees_the_unreadable_row_refuses(agent: Agent) -> None:
    assert (
        admission_check(agent=agent, model="m1", now_ms=NOW) is None
    )  # the view is read: nothing binds
    insert_row(kind="bogus")  # as a newer version, or an operator's SQL, would write it
    later = NOW + JOURNAL_POLL_MS + 1  # the next check polls
    read_rows, check_started = threading.Event(), threading.Event()

    def pause_after_reading_new_rows(
        execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        result = execute(sql, params, many, context)
        if '"id" > ' in sql:  # the poll's read of the rows after the view's last id
            read_rows.set()
            check_started.wait(timeout=5)
            threading.Event().wait(0.5)  # the poll goes on after the check has begun
        return result

    poll_saw: list[Any] = []

    def poll() -> None:
        try:
            with connection.execute_wrapper(pause_after_reading_new_rows):
                poll_saw.append(journal_binding(now_ms=later))
        finally:
            connection.close()

    poller = threading.Thread(target=poll)
    poller.start()
    assert read_rows.wait(timeout=10), "the poll never read the new rows"
    check_started.set()
    hold = admission_check(agent=agent, model="m1", now_ms=later)
    poller.join(timeout=10)
    assert poll_saw and not poll_saw[0].readable
    # The unreadable row was already in this process when the check was made: it refuses.
    assert hold is not None and (hold.model, hold.source) == ("*", "unreadable")
