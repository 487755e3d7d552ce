"""The admin's spend of all projects (issue 55): each project's spend over the last ``days``
local days, the days over all of them as a chart, the total, and every budget (agents' and
projects') as a bar of spent and reserved against its amount, held ones marked. A fixed
handful of queries whatever the number of projects, agents and budgets
(``interfaces.spend.all_projects_spend``, ``every_budget``); the bars are SVG drawn here."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.safestring import mark_safe

from agentops.budget_api import budget_out
from agentops.models import Budget, Project
from agentops.prices import decimal_text
from interfaces.admin.spend import DEFAULT_DAYS, cost_shown, spend_chart_svg
from interfaces.spend import all_projects_spend, check_days, every_budget

# Shares of the amount drawn, as widths in a 0..100 box.
_PLACES = Decimal("0.01")


def bar_shares(out: dict[str, Any]) -> tuple[Decimal, Decimal]:
    """The widths (percent of the bar) of what is spent and what is reserved, from
    ``budget_out``: spent first, reserved after it, together never past the bar's end (a
    budget whose spent and reserved together pass its amount fills the bar, and the page says by
    how much)."""
    amount = Decimal(out["amount"])
    spent = min(Decimal(out["spent"]) / amount, Decimal(1)) * 100
    reserved = min(Decimal(out["reserved"]) / amount * 100, 100 - spent)
    return spent.quantize(_PLACES), reserved.quantize(_PLACES)


def budget_bar_svg(out: dict[str, Any], *, currency: str) -> str:
    """The bar of one budget: its amount the whole width, spent and reserved as two rects
    (``data-share`` their percent); held, the bar carries the ``held`` class. Texts escaped."""
    spent, reserved = bar_shares(out)
    title = (
        f"spent {out['spent']} and reserved {out['reserved']} of {out['amount']} {currency} "
        f"per {out['period']}, {out['left']} left" + (", held" if out["held"] else "")
    )
    return (
        f'<svg class="budget-bar{" held" if out["held"] else ""}" viewBox="0 0 100 10" '
        f'preserveAspectRatio="none" role="img" aria-label="{escape(title)}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
        f'<rect class="amount" x="0" y="0" width="100" height="10"/>'
        f'<rect class="spent" data-share="{spent}" x="0" y="0" width="{spent}" height="10"/>'
        f'<rect class="reserved" data-share="{reserved}" x="{spent}" y="0" '
        f'width="{reserved}" height="10"/></svg>'
    )


def budget_rows(budgets: list[Budget], *, now: datetime, currency: str) -> list[dict[str, Any]]:
    """Each budget as the page lists it: its owner (kind, name, project, the owner's budget
    page), ``budget_out``'s figures and its bar."""
    rows = []
    for b in budgets:
        out = budget_out(b, now)
        if b.agent is not None:
            kind, name, project = "agent", b.agent.name, b.agent.project.name
            page = reverse("admin:agentops_agent_budget", args=[b.agent.pk])
        else:
            assert b.project is not None  # a budget is of an agent or of a project
            kind, name, project = "project", b.project.name, b.project.name
            page = reverse("admin:agentops_project_budget", args=[b.project.pk])
        over = Decimal(out["spent"]) + Decimal(out["reserved"]) - Decimal(out["amount"])
        rows.append(
            {
                **out,
                "id": b.pk,
                "kind": kind,
                "owner": name,
                "project": project,
                "page": page,
                "over": decimal_text(over) if over > 0 else None,
                # Safe: budget_bar_svg escapes every text it puts in the markup.
                "bar": mark_safe(budget_bar_svg(out, currency=currency)),
            }
        )
    return rows


def all_projects_spend_view(
    model_admin: admin.ModelAdmin[Project], request: HttpRequest
) -> HttpResponse:
    """GET ``?days=N`` (1..366, default 30): the page; a bad ``days`` answers 400 with the
    message and the form."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "title": "Spend of all projects",
        "days_choices": (7, 30, 90, 366),
    }
    template = "admin/agentops/project/spend_all.html"
    try:
        days = check_days(request.GET.get("days"), default=DEFAULT_DAYS)
    except ValueError as exc:
        context.update(error=str(exc), days=request.GET.get("days", "")[:40])
        return TemplateResponse(request, template, context, status=400)
    now = timezone.now()
    spend = all_projects_spend(days=days, now=now)
    projects = [
        {
            **p,
            "cost_shown": cost_shown(p),
            "page": reverse("admin:agentops_project_spend", args=[p["project_id"]]),
        }
        for p in spend["projects"]
    ]
    context.update(
        days=days,
        spend=spend,
        projects=projects,
        total={**spend["total"], "cost_shown": cost_shown(spend["total"])},
        # Safe: spend_chart_svg escapes every text it puts in the markup.
        chart=mark_safe(spend_chart_svg(spend["days"], currency=spend["currency"])),
        budgets=budget_rows(every_budget(), now=now, currency=spend["currency"]),
    )
    return TemplateResponse(request, template, context)
