"""Admin for agents: their page with status, holds, targets, budget and history, and the form
that checks their targets as the API does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import Count, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join

from agentops.exceptions import BadRequest
from agentops.models import (
    Agent,
)
from agentops.prices import decimal_text
from agentops.selectors import providers_granted
from agentops.services import fallbacks_checked, targets_checked
from inference.models import InferenceCall
from interfaces.admin.base import RuntimeReadsAdmin
from interfaces.edge import runtime_of

if TYPE_CHECKING:
    from inference.models import Turn
    from turns.runtime import TurnRuntime


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


@admin.register(Agent)
class AgentAdmin(RuntimeReadsAdmin):
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

    def runtime_reads(self, rt: TurnRuntime, obj: Any) -> None:
        """The alternate serving it now (``serving``, ``model_served``)."""
        from interfaces.selectors import agent_serving

        obj.page_serving = agent_serving(rt.pacer, obj)

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

        pacer = runtime_of(request).pacer
        for agent in changelist.result_list:
            agent.page_holds = by_agent.get(agent.name, [])
            # The routing choice (turns.serving): no query for an agent without alternates, a
            # few for one with them.
            agent.page_serving = agent_serving(pacer, agent)
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
        serving = getattr(obj, "page_serving", None)
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
