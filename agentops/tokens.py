"""API tokens: created once, stored only as a hash (API.md, Authentication)."""

from __future__ import annotations

import hashlib
import secrets

from django.utils import timezone

from . import rows
from .models import DEFAULT_PROJECT, ApiToken, Project

TOKEN_PREFIX = "ao_"
# A token's last_used_at is written when the row read says it is older than this: not one
# UPDATE per request (each process may write it once in the same window).
LAST_USED_EVERY_S = 30.0


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def api_token_create(
    *, name: str, operator: bool, project: str = DEFAULT_PROJECT
) -> tuple[ApiToken, str]:
    """Create a token in ``project`` (created if new); return the row and the token itself,
    which is never stored."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    project_row, _ = Project.objects.get_or_create(name=project)
    row = ApiToken.objects.create(
        name=name,
        token_hash=_hash(token),
        prefix=token[:10],
        operator=operator,
        project=project_row,
    )
    return row, token


def api_token_check(token: str) -> ApiToken | None:
    """The live token row for ``token``, or None. Its ``last_used_at`` is at most
    ``LAST_USED_EVERY_S`` behind its latest use."""
    if not token or len(token) > 200:
        return None
    # Hand-written (``agentops.rows``): every request reads it.
    found = rows.fetch(
        f"""SELECT {rows.columns(ApiToken, "t")}, {rows.columns(Project, "p")}
        FROM {ApiToken._meta.db_table} t JOIN {Project._meta.db_table} p ON p.id = t.project_id
        WHERE t.token_hash = %s AND t.revoked_at IS NULL""",
        [_hash(token)],
        ApiToken,
        Project,
    )
    if not found:
        return None
    row, project = found[0]
    assert isinstance(row, ApiToken) and isinstance(project, Project)
    row.project = project
    now = timezone.now()
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() >= LAST_USED_EVERY_S:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row
