"""HTML pages of the service outside the admin: the live operator dashboard (architecture.md §9)."""

from __future__ import annotations

from django.contrib.admin.views.decorators import staff_member_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_safe

from interfaces.dashboard import dashboard_snapshot
from interfaces.edge import runtime_of
from waits.clock import clock_ms


@require_safe
@staff_member_required
def dashboard_view(request: HttpRequest) -> HttpResponse:
    """The page renders from the snapshot read now, embedded as JSON, so it shows the state at
    once; its script then opens ``/ws/dashboard`` and applies live events (and a fresh
    snapshot every few seconds, for what has no event of its own: breaker changes)."""
    return render(
        request,
        "dashboard/index.html",
        {"snapshot": dashboard_snapshot(runtime_of(request).pacer, now_ms=clock_ms())},
    )
