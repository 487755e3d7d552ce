"""Helpers for the provider-waits tests: a clean process view per test, raw journal rows (as
an operator's SQL or another version would write them), and a journal that refuses writes.

Refusing writes is done at the process edge, in PostgreSQL: a trigger raises the SQLSTATE of
the failure being modelled, so the service's own code runs unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from agentops.models import Agent
from tests.conftest import _database_url
from tests.factories import AgentFactory
from waits.journal import journal_forget_process_state, ms_to_datetime
from waits.models import WaitJournalEntry

BASE_DIR = Path(__file__).resolve().parents[2]
NOW = 1_800_000_000_000.0  # 2027-01-15T08:00:00Z: an explicit now, well inside the range
TABLE = WaitJournalEntry._meta.db_table


def restart() -> None:
    """What a process restart does to the journal's process state."""
    journal_forget_process_state()


@pytest.fixture
def agent(db: None) -> Agent:
    made: Agent = AgentFactory.create(name="ada", model="m1")
    return made


def insert_row(
    *,
    kind: str,
    agent: str = "ada",
    model: str = "m1",
    until_ms: int | None = None,
    reason: str = "written in SQL",
    by: str = "sql",
    at_ms: float = NOW,
    data: dict[str, Any] | None = None,
    act_id: str | None = None,
) -> int:
    """Insert a journal row directly, bypassing the service, and return its id."""
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO {TABLE} (act_id, kind, agent, model, until_ms, reason, "by", at, data) '
            "VALUES (COALESCE(%s::uuid, gen_random_uuid()), %s, %s, %s, %s, %s, %s, %s, %s::jsonb) "
            "RETURNING id",
            [
                act_id,
                kind,
                agent,
                model,
                until_ms,
                reason,
                by,
                ms_to_datetime(at_ms),
                json.dumps(data or {}),
            ],
        )
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def refuse_writes(db: None) -> Iterator[Callable[..., None]]:
    """``refuse_writes(sqlstate, when=SQL)`` makes inserts into the journal (those whose NEW row
    matches ``when``) fail with that SQLSTATE (08006 connection failure, 40001 serialization
    failure, 23514 check violation ...); ``refuse_writes(None)`` lets them through again."""

    def set_refusal(sqlstate: str | None = "08006", *, when: str = "true") -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TRIGGER IF EXISTS waits_test_refuse ON {TABLE}")
            if sqlstate is None:
                return
            cursor.execute(
                "CREATE OR REPLACE FUNCTION waits_test_refuse() RETURNS trigger AS $$ BEGIN "
                f"IF {when} THEN RAISE EXCEPTION 'journal writes are refused by the test' "
                f"USING ERRCODE = '{sqlstate}'; END IF; "
                "RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            cursor.execute(
                f"CREATE TRIGGER waits_test_refuse BEFORE INSERT ON {TABLE} FOR EACH ROW "
                "EXECUTE FUNCTION waits_test_refuse()"
            )

    yield set_refusal
    set_refusal(None)


def run_in_another_process(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` (after django.setup()) in a separate process on the test database."""
    script = (
        "import django, os\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'agentops.settings')\n"
        "django.setup()\n" + code
    )
    env = dict(
        os.environ,
        DATABASE_URL=_database_url(),
        AGENTOPS_FAILURES_LOG=str(settings.AGENTOPS_FAILURES_LOG),
    )
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    """``python manage.py ARGS`` in a separate process on the test database."""
    env = dict(
        os.environ,
        DATABASE_URL=_database_url(),
        AGENTOPS_FAILURES_LOG=str(settings.AGENTOPS_FAILURES_LOG),
    )
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
