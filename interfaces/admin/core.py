"""Admin for the core records but agents (``agents``): providers, projects, prices, history rows,
tokens, audit entries and alerts; records (tokens, audit entries) are read-only here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join

from agentops.models import (
    Alert,
    ApiToken,
    AuditEntry,
    HistoryRow,
    Price,
    Project,
    Provider,
)
from agentops.project_limits import (
    LIMIT_MAXIMA,
    ProjectLimits,
    project_limits_of,
    project_limits_put,
)
from agentops.providers import provider_problem
from agentops.validation import instant_problem
from agentops.wording import excerpt
from interfaces.admin.base import ReadOnlyAdmin, RuntimeReadsAdmin
from interfaces.admin.display import when
from interfaces.edge import runtime_of
from waits.limits import provider_limits

if TYPE_CHECKING:
    from turns.runtime import TurnRuntime

admin.site.site_header = "agentops operations"
admin.site.site_url = "/dashboard/"  # "View site": the live dashboard
admin.site.site_title = "agentops"
# No app list beside every page: the lists need its 300 px at 1,366 px to show each cell's words
# whole (the index page and the breadcrumbs lead to every list).
admin.site.enable_nav_sidebar = False


class ProviderForm(forms.ModelForm):
    """The provider policy of the API (agentops.providers), for rows saved in the admin."""

    class Meta:
        model = Provider
        fields = ("name", "kind", "base_url", "api_key_env")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if "base_url" in data and "api_key_env" in data:
            refused = provider_problem(
                base_url=data["base_url"], api_key_env=data["api_key_env"] or ""
            )
            if refused:
                self.add_error(refused[0], refused[1])
        return data


@admin.register(Provider)
class ProviderAdmin(RuntimeReadsAdmin):
    form = ProviderForm
    list_display = ("name", "kind", "base_url", "api_key_env", "created_at")
    search_fields = ("name",)
    readonly_fields = ("limits",)

    def runtime_reads(self, rt: TurnRuntime, obj: Any) -> None:
        """Its limits as this process's pacer reads them (``limits``)."""
        obj.page_limits = provider_limits(rt.pacer, obj.name)

    @admin.display(description="limits (architecture.md §6.12, §6.13)")
    def limits(self, obj: Provider) -> str:
        """What its remaining-quota headers last said per model, the scoped waits that hold
        it, and a Release for those."""
        if obj.pk is None:
            return "-"
        rows: list[dict[str, Any]] = getattr(obj, "page_limits", [])
        if not rows:
            return "none known: no answer with quota headers yet, and nothing holds it"
        release = reverse("admin:waits_bindingwait_release_limit")
        return format_html(
            "<table class='provider-limits'><tr><th>model</th><th>requests left</th>"
            "<th>tokens left</th><th>resets at</th><th>paced until</th><th>held until</th>"
            "<th></th></tr>{}</table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                "<td>{}</td></tr>",
                (
                    (
                        row["model"],
                        _shown(row["remaining_requests"]),
                        _shown(row["remaining_tokens"]),
                        _shown(row["resets_at"]),
                        _shown(row["paced_until"]),
                        ("until released" if row["held_until"] is None else row["held_until"])
                        if row["held"]
                        else "-",
                        format_html(
                            "<a class='button release-limit' href='{}?provider={}&amp;model={}'>"
                            "Release</a>",
                            release,
                            obj.name,
                            row["model"],
                        )
                        if row["held"]
                        else "",
                    )
                    for row in rows
                ),
            ),
        )


def _shown(value: object) -> str:
    return "-" if value is None else str(value)


class ProjectForm(forms.ModelForm):  # type: ignore[type-arg]
    """A project's limits (architecture.md §6.14) within the API's bounds; empty: no limit."""

    requests_per_minute = forms.IntegerField(
        required=False, min_value=1, max_value=LIMIT_MAXIMA["requests_per_minute"]
    )
    tokens_per_minute = forms.IntegerField(
        required=False, min_value=1, max_value=LIMIT_MAXIMA["tokens_per_minute"]
    )
    concurrent_calls = forms.IntegerField(
        required=False, min_value=1, max_value=LIMIT_MAXIMA["concurrent_calls"]
    )

    class Meta:
        model = Project
        fields = ("name", *LIMIT_MAXIMA)


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    """Each project links to its spend page (interfaces.admin.spend), from the list and from
    its own page (the "Spend" button, templates/admin/agentops/project/change_form.html); the
    list links to the spend of all projects (interfaces.admin.spend_all) and its page to its
    budget (interfaces.admin.budgets)."""

    form = ProjectForm
    list_display = ("name", "providers", "limits", "spend", "created_at")
    search_fields = ("name",)
    # The grant is made through the API (PUT /projects/{name}/providers), which refuses a list
    # that leaves out a provider a live agent names: shown here, not edited.
    fields = (
        "name",
        "providers",
        "providers_granted_at",
        *LIMIT_MAXIMA,
        "limits_set_at",
        "budget_shown",
    )
    readonly_fields = ("providers", "providers_granted_at", "limits_set_at", "budget_shown")

    @admin.display(description="limits")
    def limits(self, obj: Project) -> str:
        set_ = {k: v for k, v in project_limits_of(obj).as_dict().items() if v is not None}
        return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in set_.items()) or "none"

    def save_model(self, request: HttpRequest, obj: Project, form: Any, change: bool) -> None:
        """The limits through their service (audited, ``admin:<user>``); the rest as usual."""
        limits = ProjectLimits(**{f: form.cleaned_data.get(f) for f in LIMIT_MAXIMA})
        stored = Project.objects.filter(pk=obj.pk).first() if change else None
        for field in LIMIT_MAXIMA:
            setattr(obj, field, getattr(stored, field) if stored is not None else None)
        super().save_model(request, obj, form, change)
        if any(f in form.changed_data for f in LIMIT_MAXIMA):
            project_limits_put(
                project=obj, limits=limits, actor=f"admin:{request.user.get_username()}"
            )
            obj.refresh_from_db()

    def get_queryset(self, request: HttpRequest) -> QuerySet[Project]:
        return super().get_queryset(request).prefetch_related("granted_providers")

    @admin.display(description="providers granted")
    def providers(self, obj: Project) -> str:
        if obj.providers_granted_at is None:
            return "all (never granted)"
        return ", ".join(sorted(p.name for p in obj.granted_providers.all())) or "none"

    def get_urls(self) -> list[URLPattern]:
        from interfaces.admin.budgets import budget_view
        from interfaces.admin.spend import project_spend_view
        from interfaces.admin.spend_all import all_projects_spend_view
        from interfaces.admin.spend_csv import spend_csv_view

        def one(request: HttpRequest, object_id: str) -> HttpResponse:
            return project_spend_view(self, request, object_id)

        def one_csv(request: HttpRequest, object_id: str) -> HttpResponseBase:
            return spend_csv_view(self, request, object_id)

        def every(request: HttpRequest) -> HttpResponse:
            return all_projects_spend_view(self, request)

        def every_csv(request: HttpRequest) -> HttpResponseBase:
            return spend_csv_view(self, request, None)

        def budget(request: HttpRequest, object_id: str) -> HttpResponse:
            return budget_view(self, request, object_id, kind="project")

        view = self.admin_site.admin_view
        # Before the admin's own: "spend/" would otherwise be read as a project's id.
        return [
            path("spend/", view(every), name="agentops_project_spend_all"),
            path("spend.csv", view(every_csv), name="agentops_project_spend_all_csv"),
            path("<path:object_id>/spend/", view(one), name="agentops_project_spend"),
            path("<path:object_id>/spend.csv", view(one_csv), name="agentops_project_spend_csv"),
            path("<path:object_id>/budget/", view(budget), name="agentops_project_budget"),
            *super().get_urls(),
        ]

    # Not "budget": that name is the model's reverse accessor, which the admin would show.
    @admin.display(description="budget")
    def budget_shown(self, obj: Project) -> str:
        from interfaces.admin.budgets import budget_summary

        return budget_summary(obj, kind="project")

    @admin.display(description="spend")
    def spend(self, obj: Project) -> str:
        url = reverse("admin:agentops_project_spend", args=[obj.pk])
        return format_html('<a class="project-spend" href="{}">spend per day</a>', url)


PRICE_COLUMNS = (
    "provider",
    "model",
    "input_per_mtok",
    "output_per_mtok",
    "cached_input_per_mtok",
    "cache_write_per_mtok",
    "reasoning_per_mtok",
    "currency",
    "effective_from",
)


class PriceForm(forms.ModelForm):
    """The API's bounds on a price's instant (agentops.validation.instant_problem)."""

    class Meta:
        model = Price
        fields = PRICE_COLUMNS

    def clean_effective_from(self) -> Any:
        value = self.cleaned_data.get("effective_from")
        problem = instant_problem(value) if value is not None else None
        if problem:
            raise forms.ValidationError(problem)
        return value


@admin.register(Price)
class PriceAdmin(admin.ModelAdmin):
    """Prices are added, never edited: a change is a new row from its instant on, so the calls
    priced before keep their cost (the fields of a saved price are read-only)."""

    list_display = PRICE_COLUMNS
    form = PriceForm
    list_filter = ("provider", "currency")
    search_fields = ("model",)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ()
        return [f.name for f in Price._meta.fields]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Price, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        # This process's copy at once; the others' within its bound.
        runtime_of(request).prices.forget()


@admin.register(HistoryRow)
class HistoryRowAdmin(ReadOnlyAdmin):
    """History is never edited here. Set-aside rows are marked, and an operator with the
    ``breaker.restore_historyrow`` permission can put them back (audited)."""

    list_display = (
        "agent",
        "seq",
        "participant",
        "role",
        "state_marked",
        "short_content",
        "set_aside_reason",
        "created_at",
    )
    list_filter = ("state", "role", "agent")
    search_fields = ("agent__name", "participant")
    actions = ["restore"]

    @admin.display(description="state", ordering="state")
    def state_marked(self, obj: HistoryRow) -> str:
        return "SET ASIDE" if obj.state == HistoryRow.State.SET_ASIDE else obj.state

    def has_restore_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("breaker.restore_historyrow")

    @admin.action(description="Restore the selected set-aside rows", permissions=["restore"])
    def restore(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        """A confirmation page that asks for a reason, as Release does; its POST (``confirmed``)
        restores each row with the reason in its audit entry (``history_row_restore``)."""
        from agentops.exceptions import AgentopsError
        from breaker.services import RESTORE_REASON_LIMIT, history_row_restore

        rows = list(
            queryset.filter(state=HistoryRow.State.SET_ASIDE)
            .select_related("agent")
            .order_by("agent__name", "seq")
        )
        reason = request.POST.get("reason", "")
        error = ""
        if request.POST.get("confirmed"):
            if not reason.strip():
                error = "reason: a reason is required"
            else:
                restored = 0
                for row in rows:
                    try:
                        history_row_restore(
                            agent_name=row.agent.name,
                            row_id=row.pk,
                            actor=f"admin:{request.user.get_username()}",
                            requester=None,
                            reason=reason,
                        )
                        restored += 1
                    except AgentopsError as exc:
                        self.message_user(request, f"Row {row.pk}: {exc.message}", level="warning")
                self.message_user(request, f"Restored {restored} row(s).")
                return None
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Restore set-aside history rows",
            "rows": rows,
            "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
            "reason": reason,
            "reason_limit": RESTORE_REASON_LIMIT,
            "error": error,
        }
        return TemplateResponse(
            request,
            "admin/agentops/historyrow/restore_confirm.html",
            context,
            status=400 if error else 200,
        )

    @admin.display(description="content")
    def short_content(self, obj: HistoryRow) -> str:
        text = (
            obj.content
            if isinstance(obj.content, str)
            else " ".join(
                str(b.get("text") or b.get("name") or b.get("content") or "")
                for b in obj.content
                if isinstance(b, dict)
            )
        )
        return text[:120]


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "project",
        "prefix",
        "operator",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("project", "operator")
    exclude = ("token_hash",)


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor", "action", "target", "reason")
    list_filter = ("action",)
    search_fields = ("actor", "target", "reason")


@admin.register(Alert)
class AlertAdmin(ReadOnlyAdmin):
    """Alerts are records; the one change an operator makes is to acknowledge them, which needs
    the ``agentops.acknowledge_alert`` permission."""

    list_display = (
        "raised",
        "kind",
        "agent",
        "model",
        "verdict",
        "short_message",
        "acknowledged_at",
        "acknowledged_by",
    )
    list_filter = ("kind", "verdict", ("acknowledged_at", admin.EmptyFieldListFilter))
    search_fields = ("agent", "model", "message")
    actions = ["acknowledge"]

    @admin.display(description="raised", ordering="created_at")
    def raised(self, obj: Alert) -> Any:
        return when(obj.created_at)

    @admin.display(description="message")
    def short_message(self, obj: Alert) -> str:
        return excerpt(obj.message, 160)

    def has_acknowledge_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("agentops.acknowledge_alert")

    @admin.action(description="Acknowledge the selected alerts", permissions=["acknowledge"])
    def acknowledge(self, request: HttpRequest, queryset: Any) -> None:
        from django.utils import timezone

        from agentops.alerts import alert_acknowledge
        from agentops.exceptions import Conflict

        done = 0
        for alert_id in queryset.filter(acknowledged_at__isnull=True).values_list("id", flat=True):
            try:
                alert_acknowledge(
                    alert_id=alert_id,
                    actor=f"admin:{request.user.get_username()}",
                    now=timezone.now(),
                )
                done += 1
            except Conflict:
                continue  # acknowledged meanwhile by someone else
        self.message_user(request, f"Acknowledged {done} alert(s).")
