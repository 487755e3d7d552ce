"""Admin for the core records. Records (tokens, audit entries) are read-only here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.views.main import ChangeList
from django.db.models import Count, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join

from agentops.exceptions import BadRequest
from agentops.models import (
    Agent,
    Alert,
    ApiToken,
    AuditEntry,
    HistoryRow,
    Price,
    Project,
    Provider,
)
from agentops.prices import PriceBook, decimal_text
from agentops.project_limits import (
    LIMIT_MAXIMA,
    ProjectLimits,
    project_limits_of,
    project_limits_put,
)
from agentops.providers import provider_problem
from agentops.runtime import runtime
from agentops.selectors import providers_granted
from agentops.services import fallbacks_checked, targets_checked
from agentops.validation import instant_problem
from agentops.wording import excerpt
from inference.models import InferenceCall
from interfaces.admin.base import ReadOnlyAdmin
from interfaces.admin.display import when
from waits.limits import provider_limits

if TYPE_CHECKING:
    from inference.models import Turn

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
class ProviderAdmin(admin.ModelAdmin):
    form = ProviderForm
    list_display = ("name", "kind", "base_url", "api_key_env", "created_at")
    search_fields = ("name",)
    readonly_fields = ("limits",)

    @admin.display(description="limits (architecture.md §6.12, §6.13)")
    def limits(self, obj: Provider) -> str:
        """What its remaining-quota headers last said per model, the scoped waits that hold
        it, and a Release for those."""
        if obj.pk is None:
            return "-"
        rows = provider_limits(obj.name)
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


class AgentForm(forms.ModelForm):
    """The pool and the alternates are checked as the API checks them (architecture.md §6.11,
    §6.15)."""

    class Meta:
        model = Agent
        fields = (
            "name",
            "project",
            "kind",
            "provider",
            "model",
            "pool",
            "fallbacks",
            "hedge_after_ms",
            "context_window",
            "context_policy",
            "participant",
            "system",
            "max_tokens",
            "thinking_budget",
            "stream",
            "tools",
        )
        help_texts = {
            "pool": 'Members sharing the calls, at most 8: [{"provider": "name", "model": '
            '"name", "weight": 1}], each a provider and model other than the agent\'s own '
            "(which is a member of weight 1).",
            "fallbacks": 'In order, at most 4: [{"provider": "name", "model": "name", '
            '"context_window": null}], each a provider and model other than the agent\'s own.',
            "hedge_after_ms": "Empty: off. Else, when a call has produced no content after this "
            "many ms, the request is also sent to the first free alternate; the first to answer "
            "is relayed and the other cancelled (both are recorded and costed).",
        }

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        listed = cleaned.get("fallbacks") or []
        shaped = (
            isinstance(listed, list)
            and len(listed) <= 4
            and all(
                isinstance(f, dict)
                and isinstance(f.get("provider"), str)
                and isinstance(f.get("model"), str)
                and f["model"].strip()
                and (f.get("context_window") is None or type(f.get("context_window")) is int)
                for f in listed
            )
        )
        if not shaped:
            self.add_error(
                "fallbacks",
                "a list of at most 4 objects, each with a provider and a model name "
                "(and optionally a context_window in tokens)",
            )
            return cleaned
        members = cleaned.get("pool") or []
        if not (
            isinstance(members, list)
            and len(members) <= 8
            and all(
                isinstance(m, dict)
                and isinstance(m.get("provider"), str)
                and isinstance(m.get("model"), str)
                and m["model"].strip()
                and (m.get("weight") is None or (type(m["weight"]) is int and m["weight"] >= 1))
                for m in members
            )
        ):
            self.add_error(
                "pool",
                "a list of at most 8 objects, each with a provider and a model name "
                "(and optionally a weight of 1 or more)",
            )
            return cleaned
        provider, project = cleaned.get("provider"), cleaned.get("project")
        project_id = project.pk if project is not None else None
        if (
            provider is not None
            and project_id is not None
            and not providers_granted(project_id=project_id).filter(pk=provider.pk).exists()
        ):
            self.add_error("provider", f"{provider.name!r} is not granted to project {project}")
        own = (provider.name if provider is not None else "", str(cleaned.get("model") or ""))
        try:
            cleaned["pool"] = targets_checked(
                members,
                field="pool",
                seen={own},
                max_tokens=cleaned.get("max_tokens"),
                project_id=project_id,
            )
        except BadRequest as exc:
            self.add_error("pool", str(exc))
            return cleaned
        try:
            cleaned["fallbacks"] = fallbacks_checked(
                listed,
                model=own[1],
                provider=own[0],
                max_tokens=cleaned.get("max_tokens"),
                project_id=project_id,
                pool=cleaned["pool"],
            )
        except BadRequest as exc:
            self.add_error("fallbacks", str(exc))
        return cleaned


# An agent's calls, grouped to one row in a subquery (the admin's spend column).
_calls_of_agent = InferenceCall.objects.filter(agent=OuterRef("pk")).order_by().values("agent")


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
        runtime().part(PriceBook).forget()


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    """The list reads a fixed handful of queries whatever the page size: each agent's streak is
    annotated, its open turns prefetched, and the binding waits read once for the page (a
    journal read reduces the whole journal; once per row made a page of 100 agents crawl).
    Only an agent with alternates adds its routing choice's few reads (the on-alternate mark)."""

    list_display = (
        "name",
        "project",
        "kind",
        "provider",
        "model_served",
        "status",
        "failure_streak",
        "holds",
        "current_turn",
        "spend",
        "disposed_at",
    )
    list_filter = ("project", "kind", "provider")
    search_fields = ("name", "model")
    form = AgentForm
    readonly_fields = (
        "serving",
        "status",
        "failure_streak",
        "holds",
        "current_turn",
        "context",
        "budget_shown",
        "created_at",
        "disposed_at",
    )

    def get_urls(self) -> list[URLPattern]:
        from interfaces.admin.budgets import budget_view

        def budget(request: HttpRequest, object_id: str) -> HttpResponse:
            return budget_view(self, request, object_id, kind="agent")

        page = path(
            "<path:object_id>/budget/",
            self.admin_site.admin_view(budget),
            name="agentops_agent_budget",
        )
        return [page, *super().get_urls()]

    @admin.display(description="budget")
    def budget_shown(self, obj: Agent) -> str:
        """Its budget's figures (``budget_out``) and a link to its budget page."""
        from interfaces.admin.budgets import budget_summary

        return budget_summary(obj, kind="agent")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Agent]:
        from breaker.models import BreakerState
        from interfaces.selectors import agent_open_turns

        streak = BreakerState.objects.filter(agent=OuterRef("pk")).values("streak")[:1]
        return (
            super()
            .get_queryset(request)
            .select_related("provider", "project")
            .annotate(
                breaker_streak=Coalesce(Subquery(streak), 0),
                spent=Subquery(_calls_of_agent.annotate(t=Sum("cost")).values("t")[:1]),
                unpriced=Subquery(
                    _calls_of_agent.filter(outcome__isnull=False, cost__isnull=True)
                    .annotate(n=Count("id"))
                    .values("n")[:1]
                ),
            )
            .prefetch_related(agent_open_turns())
        )

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        from waits.clock import clock_ms
        from waits.selectors import binding_waits

        changelist = super().get_changelist_instance(request)
        _, waits = binding_waits(now_ms=clock_ms())
        by_agent: dict[str, list[dict[str, Any]]] = {}
        for wait in waits:
            by_agent.setdefault(wait["agent"], []).append(wait)
        from interfaces.selectors import agent_serving

        for agent in changelist.result_list:
            agent.page_holds = by_agent.get(agent.name, [])
            # The routing choice (turns.serving): no query for an agent without alternates, a
            # few for one with them.
            agent.page_serving = agent_serving(agent)
        return changelist

    def _current(self, obj: Agent) -> Turn | None:
        from interfaces.selectors import agent_current_turn, current_turn_of

        open_turns = getattr(obj, "open_turns", None)
        return agent_current_turn(obj) if open_turns is None else current_turn_of(open_turns)

    @admin.display(description="model", ordering="model")
    def model_served(self, obj: Agent) -> str:
        """The agent's model, marked when an alternate serves it now (and which, and why)."""
        serving = getattr(obj, "page_serving", None)
        if serving is None:
            return obj.model
        return format_html(
            '{}<br><span class="on-alternate" title="{}">on alternate: {} on {}</span>',
            obj.model,
            serving["reason"],
            serving["model"],
            serving["provider"],
        )

    @admin.display(description="served by")
    def serving(self, obj: Agent) -> str:
        """The alternate serving the agent's calls now, and why; empty when its own model is."""
        from interfaces.selectors import agent_serving

        serving = agent_serving(obj) if obj.pk else None
        if serving is None:
            return "its own provider and model"
        return f"{serving['model']} on {serving['provider']} ({serving['reason']})"

    @admin.display(description="status")
    def status(self, obj: Agent) -> str:
        current = self._current(obj)
        return str(current.status) if current else "idle"

    @admin.display(description="spend", ordering="spent")
    def spend(self, obj: Agent) -> str:
        """The sum of the agent's costed calls, with the count of those that have no cost."""
        spent = decimal_text(getattr(obj, "spent", None)) or "-"
        unpriced = getattr(obj, "unpriced", None) or 0
        return f"{spent} (+{unpriced} unpriced)" if unpriced else spent

    @admin.display(description="failure streak")
    def failure_streak(self, obj: Agent) -> int:
        from interfaces.selectors import agent_failure_streak

        streak = getattr(obj, "breaker_streak", None)
        return agent_failure_streak(obj) if streak is None else int(streak)

    @admin.display(description="holds")
    def holds(self, obj: Agent) -> str:
        """The provider waits that bind the agent now (the Binding waits page releases them)."""
        from waits.clock import clock_ms
        from waits.selectors import binding_waits

        waits = getattr(obj, "page_holds", None)
        if waits is None:  # the agent's own page
            _, waits = binding_waits(agent=obj.name, now_ms=clock_ms())
        if not waits:
            return "-"
        return format_html_join(
            "; ",
            "{} until {}",
            (
                (w["model"], f"{w['until']:%Y-%m-%d %H:%M:%S} UTC" if w["until"] else "released")
                for w in waits
            ),
        )

    @admin.display(description="context")
    def context(self, obj: Agent) -> str:
        """The window as configured and learned, the last call's input and the share it used."""
        from turns.context.selectors import context_out, last_input_tokens

        ctx = context_out(obj, last_input_tokens([obj.pk]).get(obj.pk))
        used = ctx["used_fraction"]
        return format_html(
            "window {} · learned {} · last input {} tokens · used {} · policy {}",
            ctx["window"] or "-",
            ctx["learned"] or "-",
            ctx["last_input_tokens"] if ctx["last_input_tokens"] is not None else "-",
            f"{used:.0%}" if used is not None else "-",
            ctx["policy"],
        )

    @admin.display(description="current turn")
    def current_turn(self, obj: Agent) -> str:
        current = self._current(obj)
        if current is None:
            return "-"
        url = reverse("admin:inference_turn_change", args=[current.pk])
        return format_html('<a href="{}">turn {} ({})</a>', url, current.pk, current.status)


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
