"""The admin's spend page of a project (issue 48): its spend per local day over a period, as a bar
chart drawn here in SVG (no script, nothing from elsewhere) and as a table, the period by agent
and by model, and the project's budget. The numbers come from ``interfaces.spend``, the same
queries as ``GET /spend``."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import mark_safe

from agentops.budget_api import budget_out
from agentops.models import Budget, Project
from interfaces.spend import check_days, project_spend

DEFAULT_DAYS = 30

# The chart's drawing box (user units; the SVG scales to the page's width).
WIDTH, HEIGHT = 1000, 240
LEFT, RIGHT, TOP, BOTTOM = 70, 30, 26, 34
LABELS_MAX = 10


def _calls(n: int) -> str:
    return f"{n} call{'' if n == 1 else 's'}"


def cost_shown(item: dict[str, Any]) -> str:
    """A group's cost as the page words it: no calls, unpriced, or the amount with the count of
    its unpriced calls apart (an unpriced call is never shown as a cost of 0)."""
    if not item["calls"]:
        return "no calls"
    if item["cost"] is None:
        return f"unpriced ({_calls(item['unpriced_calls'])})"
    if item["unpriced_calls"]:
        return f"{item['cost']} (+{item['unpriced_calls']} unpriced)"
    return str(item["cost"])


def _axis_amount(value: Decimal) -> str:
    return f"{float(value):.4g}"


def spend_chart_svg(days: list[dict[str, Any]], *, currency: str) -> str:
    """One bar per day (oldest on the left), its height the day's cost against the period's
    dearest day. A day without calls draws no bar; a day whose calls are all unpriced draws a
    marker above the axis instead of a bar, and one with some unpriced calls a marker on its
    bar. Every text is escaped here."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    costs = [Decimal(d["cost"]) for d in days if d["cost"] is not None]
    top = max(costs, default=Decimal(0))
    slot = plot_w / max(len(days), 1)
    bar_w = max(slot * 0.8, 0.5)
    base = TOP + plot_h
    parts = [
        f'<svg class="spend-chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="spend per day in {escape(currency)}" xmlns="http://www.w3.org/2000/svg">'
    ]
    # The axis and its two gridlines: half and all of the dearest day.
    for share in (Decimal(0), Decimal("0.5"), Decimal(1)):
        y = base - float(share) * plot_h
        label = _axis_amount(top * share) if top > 0 else ("0" if share == 0 else "")
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        if label:
            parts.append(
                f'<text class="axis" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">'
                f"{escape(label)}</text>"
            )
    parts.append(
        f'<text class="axis" x="{LEFT - 6}" y="12" text-anchor="end">{escape(currency)}</text>'
    )
    step = max(1, math.ceil(len(days) / LABELS_MAX))
    for n, day in enumerate(days):
        x = LEFT + n * slot + (slot - bar_w) / 2
        title = f"{day['key']}: {cost_shown(day)}"
        if day["calls"]:
            title += f", {_calls(day['calls'])}"
        cls = "day" if day["calls"] else "day empty"
        parts.append(
            f'<g class="{cls}" data-day="{escape(day["key"])}"><title>{escape(title)}</title>'
        )
        # The whole slot answers the pointer, so a thin or empty bar still shows its title.
        parts.append(
            f'<rect class="slot" x="{LEFT + n * slot:.2f}" y="{TOP}" width="{slot:.2f}" '
            f'height="{plot_h}"/>'
        )
        if day["cost"] is not None and top > 0:
            h = float(Decimal(day["cost"]) / top) * plot_h
            parts.append(
                f'<rect class="bar" data-cost="{escape(day["cost"])}" x="{x:.2f}" '
                f'y="{base - h:.2f}" width="{bar_w:.2f}" height="{h:.2f}"/>'
            )
        else:
            h = 0.0
        if day["unpriced_calls"]:
            mark = min(8.0, bar_w)
            parts.append(
                f'<rect class="unpriced" data-unpriced="{day["unpriced_calls"]}" '
                f'x="{x + (bar_w - mark) / 2:.2f}" y="{base - h - mark - 2:.2f}" '
                f'width="{mark:.2f}" height="{mark:.2f}"/>'
            )
        parts.append("</g>")
        if n % step == 0 or (n == len(days) - 1 and n % step * 2 >= step):
            parts.append(
                f'<text class="axis" x="{LEFT + (n + 0.5) * slot:.1f}" y="{HEIGHT - 12}" '
                f'text-anchor="middle">{escape(day["key"][5:])}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def _shown(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**i, "cost_shown": cost_shown(i)} for i in items]


def project_spend_view(
    model_admin: admin.ModelAdmin[Project], request: HttpRequest, object_id: str
) -> HttpResponse:
    """GET ``?days=N`` (1..366, default 30): the page; a bad ``days`` answers 400 with the
    message and the form."""
    project = Project.objects.filter(pk=object_id).first() if object_id.isdigit() else None
    if project is None:
        raise Http404(f"no project with id {object_id!r}")
    if not model_admin.has_view_permission(request, project):
        raise PermissionDenied
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "original": project,
        "title": f"Spend of project {project.name}",
        "days_choices": (7, 30, 90, 366),
    }
    try:
        days = check_days(request.GET.get("days"), default=DEFAULT_DAYS)
    except ValueError as exc:
        context.update(error=str(exc), days=request.GET.get("days", "")[:40])
        return TemplateResponse(request, "admin/agentops/project/spend.html", context, status=400)
    now = timezone.now()
    spend = project_spend(project_id=project.pk, days=days, now=now)
    budget = Budget.objects.filter(project=project).first()
    context.update(
        days=days,
        spend=spend,
        # Safe: spend_chart_svg escapes every text it puts in the markup.
        chart=mark_safe(spend_chart_svg(spend["days"], currency=spend["currency"])),
        table=_shown(list(reversed(spend["days"]))),
        by_agent=_shown(spend["by_agent"]),
        by_model=_shown(spend["by_model"]),
        total=_shown([spend["total"]])[0],
        budget=budget_out(budget, now) if budget is not None else None,
    )
    return TemplateResponse(request, "admin/agentops/project/spend.html", context)
