"""A connection prepares the statements it runs again and again (AGENTOPS_DB_PREPARED_STATEMENTS),
and binds them into their text when told not to (a pooler that cannot keep them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.db import connection

from agentops.models import Agent
from tests.factories import AgentFactory


@pytest.mark.django_db
def test_a_statement_run_five_times_on_a_connection_is_prepared_and_still_reads_the_row() -> None:
    agent: Agent = AgentFactory.create()
    for _ in range(6):
        assert Agent.objects.filter(pk=agent.pk).values_list("name", flat=True).get() == agent.name
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any(
        'FROM "agentops_agent"' in statement and "$1" in statement for statement in prepared
    ), prepared


@pytest.mark.parametrize(
    ("value", "options"),
    [("true", {"server_side_binding": True, "prepare_threshold": 5}), ("false", {})],
)
def test_the_setting_turns_server_side_binding_and_preparing_on_or_off(
    value: str, options: dict[str, object]
) -> None:
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="agentops.settings",
        AGENTOPS_DB_PREPARED_STATEMENTS=value,
    )
    probe = (
        "import json, django; django.setup(); from django.conf import settings; "
        "o = settings.DATABASES['default']['OPTIONS'];"
        "print(json.dumps({k: o[k] for k in ('server_side_binding', 'prepare_threshold') "
        "if k in o}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == options
