"""The admin's budget page of an agent or a project (issue 55): the budget as ``GET .../budget``
shows it (``budget_out``), a form that sets or changes it through the API's own check and write
(``check_budget``, then ``interfaces.budgets.owner_budget_set``: the same ledger rules), and a
button that removes it. A bad value is a form error naming its field, and nothing is changed.
Viewing needs the owner's view permission; setting and removing its change permission."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from agentops.budget_api import budget_out, check_budget
from agentops.exceptions import BadRequest
from agentops.models import Agent, Budget, Project
from interfaces.admin.spend_all import budget_rows
from interfaces.budgets import owner_budget_remove, owner_budget_set
from interfaces.spend import spend_currency


class BudgetForm(forms.Form):
    """The fields of a ``PUT .../budget`` body, as text: ``check_budget`` reads them, so the
    bounds and their messages are the API's."""

    amount = forms.CharField(max_length=60, help_text="In the prices' currency, e.g. 10.00.")
    period = forms.ChoiceField(
        choices=Budget.Period.choices,
        help_text="Calendar-aligned in the budgets' time zone; a week starts on Monday.",
    )
    warn_at = forms.CharField(
        max_length=20,
        initial="0.8",
        help_text="The share of the amount spent at which a budget-warning alert is raised.",
    )

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data
        body = {"amount": data["amount"], "period": data["period"], "warn_at": data["warn_at"]}
        try:
            data["amount"], data["period"], data["warn_at"] = check_budget(body)
        except BadRequest as exc:
            field = exc.data.get("field")
            self.add_error(field if field in self.fields else None, exc.message)
        return data


def _owner(kind: str, object_id: str) -> Agent | Project:
    model: type[Agent] | type[Project] = Agent if kind == "agent" else Project
    found = model.objects.filter(pk=object_id).first() if object_id.isdigit() else None
    if found is None:
        raise Http404(f"no {kind} with id {object_id!r}")
    return found


def budget_view(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, object_id: str, *, kind: str
) -> HttpResponse:
    """GET: the page. POST ``action=set`` with the form's fields sets the budget (400 with the
    form's errors when a value is bad); POST ``action=remove`` removes it. Either redirects
    back here with a message."""
    owner = _owner(kind, object_id)
    if not model_admin.has_view_permission(request, owner):
        raise PermissionDenied
    # As the API: a disposed agent names nothing to budget (its budget may still be removed).
    disposed = isinstance(owner, Agent) and owner.disposed_at is not None
    may_change = model_admin.has_change_permission(request, owner)
    here = reverse(f"admin:agentops_{kind}_budget", args=[owner.pk])
    form = BudgetForm()
    status = 200
    if request.method == "POST":
        if not may_change:
            raise PermissionDenied
        if request.POST.get("action") == "remove":
            removed = owner_budget_remove(owner=owner)
            messages.success(
                request,
                f"The budget of {kind} {owner.name} was removed."
                if removed
                else f"{kind.capitalize()} {owner.name} had no budget.",
            )
            return HttpResponseRedirect(here)
        form = BudgetForm(request.POST)
        if disposed:
            form.add_error(None, f"agent {owner.name} is disposed: it takes no budget")
        if form.is_valid():
            data = form.cleaned_data
            owner_budget_set(
                owner=owner,
                amount=data["amount"],
                period=data["period"],
                warn_at=data["warn_at"],
                now=timezone.now(),
            )
            messages.success(request, f"The budget of {kind} {owner.name} was set.")
            return HttpResponseRedirect(here)
        status = 400
    now = timezone.now()
    currency = spend_currency()
    budget = Budget.objects.filter(**{kind: owner}).first()
    if budget is not None and request.method != "POST":
        out = budget_out(budget, now)
        form = BudgetForm(
            initial={"amount": out["amount"], "period": out["period"], "warn_at": out["warn_at"]}
        )
    # An agent's calls count against its project's budget too: shown beside it, read only.
    project_budget = (
        Budget.objects.filter(project_id=owner.project_id).select_related("project").first()
        if isinstance(owner, Agent)
        else None
    )
    rows = budget_rows(
        [b for b in (budget, project_budget) if b is not None], now=now, currency=currency
    )
    context: dict[str, Any] = {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.model._meta,
        "original": owner,
        "kind": kind,
        "title": f"Budget of {kind} {owner.name}",
        "budget": next((r for r in rows if r["kind"] == kind), None),
        "project_budget": next((r for r in rows if r["kind"] == "project"), None)
        if kind == "agent"
        else None,
        "currency": currency,
        "form": form,
        "may_change": may_change,
        "disposed": disposed,
    }
    return TemplateResponse(request, "admin/agentops/budget.html", context, status=status)


def budget_summary(owner: Agent | Project, *, kind: str) -> str:
    """The owner's budget in a line of its change page, with a link to its budget page."""
    if owner.pk is None:
        return "-"
    page = reverse(f"admin:agentops_{kind}_budget", args=[owner.pk])
    budget = Budget.objects.filter(**{kind: owner}).first()
    if budget is None:
        return format_html('none · <a class="budget-page" href="{}">set a budget</a>', page)
    out = budget_out(budget, timezone.now())
    return format_html(
        "{} per {} (warn at {}) · spent {} · reserved {} · left {} · {} · resets {} UTC · "
        '<a class="budget-page" href="{}">change or remove</a>',
        out["amount"],
        out["period"],
        out["warn_at"],
        out["spent"],
        out["reserved"],
        out["left"],
        "HELD" if out["held"] else "not held",
        f"{out['resets_at']:%Y-%m-%d %H:%M:%S}",
        page,
    )
