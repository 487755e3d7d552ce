"""The rows a spend page sums, as CSV (issue 55): one line per call of the page's period (the
same ``days``, the same project or all), streamed from a server-side cursor so a month of a busy
service is never a list in memory. Read with the page's permission (staff with the view
permission on projects)."""

from __future__ import annotations

import csv
import itertools
from collections.abc import AsyncIterator, Iterator

from asgiref.sync import sync_to_async
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    StreamingHttpResponse,
)
from django.utils import timezone

from agentops.models import Project
from interfaces.admin.spend import DEFAULT_DAYS
from interfaces.spend import CSV_HEADER, check_days, spend_calls, spend_period, spend_rows


class _Line:
    """What ``csv.writer`` writes to: each row handed back as its text, not kept."""

    def write(self, text: str) -> str:
        return text


def _lines(rows: Iterator[tuple[object, ...]]) -> Iterator[str]:
    writer = csv.writer(_Line())
    yield writer.writerow(CSV_HEADER)
    for row in rows:
        yield writer.writerow(row)


# Lines read per hop to the database thread.
CHUNK_LINES = 1000


async def _streamed(lines: Iterator[str]) -> AsyncIterator[str]:
    """The lines as the server sends them: under ASGI Django reads a plain iterator whole
    before the first byte, so they are read here a chunk at a time in the request's database
    thread (where the cursor lives), each chunk sent before the next is read."""
    take = sync_to_async(lambda: "".join(itertools.islice(lines, CHUNK_LINES)))
    while chunk := await take():
        yield chunk


def spend_csv_view(
    model_admin: admin.ModelAdmin[Project], request: HttpRequest, object_id: str | None
) -> HttpResponseBase:
    """GET ``?days=N`` as the page: the CSV of one project's calls (``object_id``) or of every
    project's (None); a bad ``days`` answers 400 with the message as text."""
    project = None
    if object_id is not None:
        project = Project.objects.filter(pk=object_id).first() if object_id.isdigit() else None
        if project is None:
            raise Http404(f"no project with id {object_id!r}")
    if not model_admin.has_view_permission(request, project):
        raise PermissionDenied
    try:
        days = check_days(request.GET.get("days"), default=DEFAULT_DAYS)
    except ValueError as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain; charset=utf-8")
    now = timezone.now()
    period = spend_period(days=days, now=now)
    calls = spend_calls(
        project_id=project.pk if project else None, since=period.since, until=period.until
    )
    name = f"spend-{project.pk if project else 'all'}-{period.days[0]}-to-{period.days[-1]}.csv"
    response = StreamingHttpResponse(_streamed(_lines(spend_rows(calls))), content_type="text/csv")
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response
