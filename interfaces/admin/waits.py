"""Admin for provider waits (architecture.md §9): the journal, read-only for everyone, and the
"Binding waits" page with a Release action behind the ``waits.release_wait`` permission.

The Release action goes to a confirmation page that asks for a reason and then calls the one
release service, ``waits.services.wait_release(via="admin")``. Its URLs come with the admin
site (``admin:waits_bindingwait_changelist`` and ``admin:waits_bindingwait_release``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse

from agentops.exceptions import AgentopsError
from calls.pacing import Pacer
from calls.records import ms_to_dt
from interfaces.admin.base import ReadOnlyAdmin
from interfaces.edge import runtime_of
from turns.holds import next_call_at
from turns.queue import held_turns_wake  # an interface may wake turns
from waits.clock import clock_ms
from waits.core import EVERY_MODEL
from waits.journal import entry_problem
from waits.limits import limit_release, scoped_waits
from waits.models import BindingWait, WaitJournalEntry
from waits.selectors import binding_waits
from waits.services import wait_release

RELEASE_PERMISSION = "waits.release_wait"


def _with_links(pacer: Pacer, waits: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each wait with the admin links of its agent and of the turn it holds (the agent's open
    turn, held ones first), the alternate serving the agent meanwhile (``serving``, None while
    its own provider and model serve), and its end in epoch ms for the page's countdown."""
    from agentops.models import Agent
    from inference.models import Turn
    from interfaces.selectors import agent_serving

    names = {w["agent"] for w in waits}
    live = Agent.objects.filter(name__in=names, disposed_at__isnull=True).select_related("provider")
    agents: dict[str, int] = {}
    serving: dict[str, dict[str, Any] | None] = {}
    for found in live:
        agents[found.name] = found.pk
        serving[found.name] = agent_serving(
            pacer, found
        )  # no query for an agent without alternates
    turns: dict[int, int] = {}
    order: dict[str, int] = {
        Turn.Status.HELD: 0,
        Turn.Status.RUNNING: 1,
        Turn.Status.QUEUED: 2,
        Turn.Status.REQUIRES_ACTION: 3,
    }
    open_turns = Turn.objects.filter(
        agent_id__in=agents.values(), status__in=Turn.OPEN
    ).values_list("agent_id", "pk", "status")
    for owner, turn, _status in sorted(open_turns, key=lambda t: (order.get(t[2], 9), t[1])):
        turns.setdefault(owner, turn)
    out = []
    for wait in waits:
        agent_id: int | None = agents.get(wait["agent"])
        turn_id: int | None = turns.get(agent_id) if agent_id is not None else None
        out.append(
            {
                **wait,
                "until_ms": wait["until"].timestamp() * 1000 if wait["until"] else None,
                "agent_url": reverse("admin:agentops_agent_change", args=[agent_id])
                if agent_id is not None
                else None,
                "turn_id": turn_id,
                "serving": serving.get(wait["agent"]),
                "turn_url": reverse("admin:inference_turn_change", args=[turn_id])
                if turn_id is not None
                else None,
            }
        )
    return out


@admin.register(WaitJournalEntry)
class WaitJournalEntryAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "agent", "model", "until", "short_reason", "by", "at", "problem")
    list_filter = ("kind",)
    search_fields = ("agent", "model", "by")
    ordering = ("-id",)

    @admin.display(description="until", ordering="until_ms")
    def until(self, obj: WaitJournalEntry) -> str:
        """The wait's end as an instant (the row keeps milliseconds since the epoch)."""
        if obj.until_ms is None:
            return "until released" if obj.kind == "set" else "-"
        try:
            return datetime.fromtimestamp(obj.until_ms / 1000, tz=UTC).strftime(
                "%Y-%m-%d %H:%M:%S UTC"
            )
        except (OverflowError, OSError, ValueError):
            return f"{obj.until_ms} ms (not an instant)"

    @admin.display(description="reason")
    def short_reason(self, obj: WaitJournalEntry) -> str:
        return obj.reason[:120]

    @admin.display(description="does not read because")
    def problem(self, obj: WaitJournalEntry) -> str:
        row = {
            f: getattr(obj, f)
            for f in ("id", "kind", "agent", "model", "until_ms", "reason", "by", "at", "data")
        }
        return entry_problem(row) or ""


def _one(request: HttpRequest, key: str) -> Any:
    """A form value as the service should judge it: missing (None), one value, or a list."""
    values = request.POST.getlist(key) if request.method == "POST" else request.GET.getlist(key)
    if not values:
        return None
    return values[0] if len(values) == 1 else values


@admin.register(BindingWait)
class BindingWaitAdmin(ReadOnlyAdmin):
    """Not a table: the list is computed from the journal by ``waits.selectors``."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return any(
            user.has_perm(p)
            for p in ("waits.view_bindingwait", "waits.view_waitjournalentry", RELEASE_PERMISSION)
        )

    def get_urls(self) -> list[URLPattern]:
        release = path(
            "release/",
            self.admin_site.admin_view(self.release_view),
            name="waits_bindingwait_release",
        )
        release_limit = path(
            "release-limit/",
            self.admin_site.admin_view(self.release_limit_view),
            name="waits_bindingwait_release_limit",
        )
        return [release, release_limit, *super().get_urls()]

    def release_limit_view(self, request: HttpRequest) -> HttpResponse:
        """A provider's limits on every agent (architecture.md §6.12). GET: the confirmation
        page; POST: release, with a reason (required)."""
        if not request.user.has_perm(RELEASE_PERMISSION):
            raise PermissionDenied
        provider, model = _one(request, "provider"), _one(request, "model")
        error, status = "", 200
        by = f"admin:{request.user.get_username()}"
        if request.method == "POST":
            reason = _one(request, "reason")
            if not isinstance(reason, str) or not reason.strip():
                error, status = "reason: a reason is required", 400
            else:
                try:
                    receipts = limit_release(provider=provider, model=model, reason=reason, by=by)
                except AgentopsError as exc:
                    error, status = exc.message, exc.status
                else:
                    held_turns_wake(provider=str(provider), model=model, by=by)
                    lifted = ", ".join(f"{r.model} ({r.release})" for r in receipts) or "none"
                    messages.success(request, f"Released {provider}'s limits: {lifted}.")
                    return HttpResponseRedirect(reverse("admin:waits_bindingwait_changelist"))
        limits = (
            [w for w in scoped_waits() if w.provider == provider and not w.ref]
            if isinstance(provider, str)
            else []
        )
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Release a provider's limit",
            "provider": provider if isinstance(provider, str) else "",
            "model": model if isinstance(model, str) else EVERY_MODEL,
            "limits": [
                {"model": w.model, "until": ms_to_dt(w.until), "reason": w.reason} for w in limits
            ],
            "error": error,
        }
        return TemplateResponse(
            request, "admin/waits/release_limit_confirm.html", context, status=status
        )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        now_ms = clock_ms()
        readable, waits = binding_waits(agent=request.GET.get("agent") or None, now_ms=now_ms)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Binding waits",
            "waits": _with_links(runtime_of(request).pacer, waits),
            "now_ms": now_ms,
            "journal_readable": readable,
            "can_release": request.user.has_perm(RELEASE_PERMISSION),
            "every_model": EVERY_MODEL,
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/waits/binding_waits.html", context)

    def release_view(self, request: HttpRequest) -> HttpResponse:
        """GET: the confirmation page. POST: release, with a reason (required)."""
        if not request.user.has_perm(RELEASE_PERMISSION):
            raise PermissionDenied
        agent, model = _one(request, "agent"), _one(request, "model")
        error = ""
        status = 200
        if request.method == "POST":
            reason = _one(request, "reason")
            if not isinstance(reason, str) or not reason.strip():
                error, status = "reason: a reason is required", 400
            else:
                try:
                    receipts = wait_release(
                        agent=agent,
                        model=model,
                        reason=reason,
                        via="admin",
                        username=request.user.get_username(),
                    )
                except AgentopsError as exc:
                    error, status = exc.message, exc.status
                else:
                    held_turns_wake(
                        agent=agent, model=model, by=f"admin:{request.user.get_username()}"
                    )
                    lifted = (
                        ", ".join(
                            f"{r.model} ({r.release}; next call at "
                            f"{next_call_at(agent=r.agent, model=r.model):%H:%M:%S} UTC)"
                            for r in receipts
                        )
                        or "no wait was binding"
                    )
                    messages.success(request, f"Released {agent}: {lifted}.")
                    return HttpResponseRedirect(reverse("admin:waits_bindingwait_changelist"))
        waits: list[dict[str, Any]] = []
        if isinstance(agent, str):
            _, waits = binding_waits(agent=agent, now_ms=clock_ms())
            if isinstance(model, str) and model != EVERY_MODEL:
                waits = [w for w in waits if w["model"] in (model, EVERY_MODEL)]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": "Release a provider wait",
            "agent": agent if isinstance(agent, str) else "",
            "model": model if isinstance(model, str) else EVERY_MODEL,
            "waits": waits,
            "error": error,
        }
        return TemplateResponse(request, "admin/waits/release_confirm.html", context, status=status)
