"""Every model change has its migration (a help text included): otherwise a deploy's
``migrate`` leaves the schema behind the code."""

from __future__ import annotations

import importlib

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_the_models_and_the_migrations_agree() -> None:
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)


@pytest.mark.django_db
def test_rows_written_before_route_kind_get_theirs_from_their_words() -> None:
    """``inference 0017_call_route_kind``'s backfill: each route's words give its kind."""
    from django.db import connection

    from inference.models import InferenceCall
    from tests.factories import CallFactory

    backfill = importlib.import_module("inference.migrations.0017_call_route_kind").BACKFILL
    words = {
        "primary": "primary",
        "primary (every alternate is held or down)": "primary",
        "fallback: primary down (a auth failure); 2 thinking blocks left out": "fallback",
        "return to primary": "returning",
        "hedge: no content from the first call after 10000 ms": "hedge",
        "pool": "pool",
        "": "primary",
    }
    ids = {CallFactory.create(route=route).pk: kind for route, kind in words.items()}
    assert set(InferenceCall.objects.values_list("route_kind", flat=True)) == {"primary"}
    with connection.cursor() as cursor:
        cursor.execute(backfill)
    assert dict(InferenceCall.objects.filter(pk__in=ids).values_list("pk", "route_kind")) == ids


@pytest.mark.django_db
def test_notes_written_before_note_kind_get_theirs_from_their_prefix() -> None:
    """``agentops 0018_history_note_kind``'s backfill: a service note's prefix gives its kind;
    a person's words, and anything not a system note, keep none."""
    from django.db import connection

    from agentops.models import HistoryRow
    from tests.factories import HistoryRowFactory

    backfill = importlib.import_module("agentops.migrations.0018_history_note_kind").BACKFILL
    note = HistoryRow.Role.SYSTEM_NOTE
    rows = {
        ("[inference-failed] The model call failed", note): "failed",
        ("[refusal-rewind] The 2 most recent turn(s) were set aside", note): "shed",
        ("[context-trim] The 3 oldest rows", note): "trim",
        ("[context-summary] The 3 oldest rows ... In summary: x", note): "summary",
        ("some other note", note): "",
        ("[context-summary] a user typed this", HistoryRow.Role.USER): "",
    }
    ids = {
        HistoryRowFactory.create(content=content, role=role).pk: kind
        for (content, role), kind in rows.items()
    }
    with connection.cursor() as cursor:
        cursor.execute(backfill)
    assert dict(HistoryRow.objects.filter(pk__in=ids).values_list("pk", "note_kind")) == ids
