"""A token's ``last_used_at`` follows its use without one UPDATE per request: it is written
when the row read says it is ``LAST_USED_EVERY_S`` or more behind (API.md, Authentication)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from agentops.models import ApiToken
from agentops.tokens import LAST_USED_EVERY_S, api_token_check, api_token_create

pytestmark = pytest.mark.django_db


def _writes(queries: CaptureQueriesContext) -> int:
    return sum(q["sql"].lstrip().upper().startswith("UPDATE") for q in queries.captured_queries)


def test_a_token_used_often_writes_its_last_use_once_a_window() -> None:
    row, token = api_token_create(name="often", operator=False)
    with CaptureQueriesContext(connection) as queries:
        for _ in range(5):
            assert api_token_check(token) is not None
    assert _writes(queries) == 1  # the first use; the next four find it recent
    first = ApiToken.objects.get(pk=row.pk).last_used_at
    assert first is not None

    # Its last use read as a window ago: the next check writes it again.
    behind = timezone.now() - timedelta(seconds=LAST_USED_EVERY_S + 1)
    ApiToken.objects.filter(pk=row.pk).update(last_used_at=behind)
    with CaptureQueriesContext(connection) as queries:
        assert api_token_check(token) is not None
        assert api_token_check(token) is not None
    assert _writes(queries) == 1
    latest = ApiToken.objects.get(pk=row.pk).last_used_at
    assert latest is not None and latest > behind + timedelta(seconds=LAST_USED_EVERY_S)


def test_a_revoked_or_unknown_token_writes_nothing() -> None:
    row, token = api_token_create(name="gone", operator=False)
    ApiToken.objects.filter(pk=row.pk).update(revoked_at=timezone.now())
    with CaptureQueriesContext(connection) as queries:
        assert api_token_check(token) is None
        assert api_token_check("ao_" + "x" * 40) is None
    assert _writes(queries) == 0
    assert ApiToken.objects.get(pk=row.pk).last_used_at is None
