"""Turns and their calls in the admin (architecture.md §9): read-only records, each call with the
picture of its timeline (calls.timeline_svg) large on its page and small in its turn."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe

from agentops.prices import decimal_text
from calls.timeline import call_timeline_svg
from calls.timeline_svg import fmt_ms
from inference.models import InferenceCall, Turn
from inference.routes import RouteKind
from interfaces.admin.base import ReadOnlyAdmin
from interfaces.admin.display import error_html, when
from interfaces.selectors import turn_waiting


def _picture(call: InferenceCall | None, *, small: bool) -> SafeString:
    if call is None or call.pk is None:
        return mark_safe("")
    # Safe: render_svg escapes every text it puts in the markup.
    return mark_safe(call_timeline_svg(call, small=small))


def tokens_shown(call: InferenceCall) -> str:
    """``in / out`` tokens, ``-`` for a count not reported (never shown as 0)."""

    def shown(value: int | None) -> str:
        return "-" if value is None else str(value)

    return f"{shown(call.input_tokens)} / {shown(call.output_tokens)}"


def cost_shown(call: InferenceCall) -> str:
    """The call's cost, or why it has none (``unpriced``, ``usage unreported``): never 0."""
    if call.cost is None:
        return call.cost_basis or "-"
    return decimal_text(call.cost) or "-"


def target_html(call: InferenceCall) -> SafeString:
    """Which target served the call and why: ``model on provider`` over its route, so a
    fallback turn's calls read as the primary's and the alternate's, not as two "primary"."""
    provider = call.provider.name if call.provider_id and call.provider else "-"
    return format_html(
        '<span class="call-target"><strong>{}</strong> on {}<br>'
        '<span class="call-route{}">{}</span></span>',
        call.model,
        provider,
        " call-route-fallback" if call.route_kind == RouteKind.FALLBACK else "",
        call.route or "-",
    )


class InferenceCallInline(admin.TabularInline):
    model = InferenceCall
    extra = 0
    can_delete = False
    show_change_link = True
    # The picture first: the instants are on the call's own page (the "View" link).
    fields = (
        "timeline",
        "kind",
        "target",
        "outcome",
        "bound",
        "lateness",
        "error_text",
        "model_events",
        "keepalives",
        "tokens",
        "cost_text",
        "sent",
    )
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).select_related("provider")

    @admin.display(description="served by (route)")
    def target(self, obj: InferenceCall) -> SafeString:
        return target_html(obj)

    @admin.display(description="cost")
    def cost_text(self, obj: InferenceCall) -> str:
        return cost_shown(obj)

    @admin.display(description="tokens in / out")
    def tokens(self, obj: InferenceCall) -> str:
        return tokens_shown(obj)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="timeline")
    def timeline(self, obj: InferenceCall) -> SafeString:
        return _picture(obj, small=True)

    @admin.display(description="cut lateness")
    def lateness(self, obj: InferenceCall) -> str:
        return _lateness(obj)

    @admin.display(description="error")
    def error_text(self, obj: InferenceCall) -> Any:
        return error_html(obj.error, message_limit=160)

    @admin.display(description="sent")
    def sent(self, obj: InferenceCall) -> Any:
        return when(obj.sent_at)


def _lateness(obj: InferenceCall) -> str:
    return (
        "-" if obj.cut_lateness_ms is None else f"{fmt_ms(obj.cut_lateness_ms)} after its deadline"
    )


@admin.register(Turn)
class TurnAdmin(ReadOnlyAdmin):
    list_display = ("id", "agent", "status", "waiting", "attempts", "rounds", "created", "ended")
    list_filter = ("status", "agent")
    list_select_related = ("agent",)
    inlines = [InferenceCallInline]
    exclude = ("trigger_rows", "error")
    readonly_fields = ("waiting", "error_text")

    @admin.display(description="created", ordering="created_at")
    def created(self, obj: Turn) -> Any:
        return when(obj.created_at)

    @admin.display(description="ended", ordering="ended_at")
    def ended(self, obj: Turn) -> Any:
        return when(obj.ended_at)

    @admin.display(description="error")
    def error_text(self, obj: Turn) -> Any:
        return error_html(obj.error)

    @admin.display(description="next call waits")
    def waiting(self, obj: Turn) -> str:
        until, reason = turn_waiting(obj)
        return "-" if until is None else f"until {until:%Y-%m-%d %H:%M:%S} UTC: {reason}"


@admin.register(InferenceCall)
class InferenceCallAdmin(ReadOnlyAdmin):
    # "streamed" is a filter, not a column: with it the titles' whole words overflow a 1,400 px
    # window.
    list_display = (
        "id",
        "agent",
        "turn",
        "kind",
        "model",
        "outcome",
        "bound",
        "model_events",
        "keepalives",
        "tokens",
        "cost_shown",
        "sent",
    )
    list_select_related = ("agent", "turn", "turn__agent")
    list_filter = ("kind", "outcome", "bound", "streamed")
    fieldsets = (
        (None, {"fields": ("timeline",)}),
        (
            "Call",
            {
                "fields": (
                    "turn",
                    "agent",
                    "kind",
                    "model",
                    "provider",
                    "route",
                    "streamed",
                    "max_tokens",
                    "round",
                    "outcome",
                    "stop_reason",
                    "error_text",
                )
            },
        ),
        (
            "Timeline",
            {
                "fields": (
                    "sent",
                    "headers_at",
                    "first_event_at",
                    "thinking_started_at",
                    "first_content_at",
                    "last_event_at",
                    "ended",
                    "model_events",
                    "keepalives",
                    "bound",
                    "bound_deadline",
                    "lateness",
                )
            },
        ),
        (
            "Token usage (empty: not reported)",
            {
                "fields": (
                    "input_tokens",
                    "output_tokens",
                    "reasoning_tokens",
                    "cached_input_tokens",
                    "cache_write_tokens",
                )
            },
        ),
        (
            "Cost (empty: unknown, never 0 in its place)",
            {"fields": ("cost", "cost_basis", "price")},
        ),
    )
    readonly_fields = ("timeline", "error_text", "sent", "ended", "lateness", "cost_shown")

    @admin.display(description="cost", ordering="cost")
    def cost_shown(self, obj: InferenceCall) -> str:
        return cost_shown(obj)

    @admin.display(description="sent", ordering="sent_at")
    def sent(self, obj: InferenceCall) -> Any:
        return when(obj.sent_at)

    @admin.display(description="ended")
    def ended(self, obj: InferenceCall) -> Any:
        return when(obj.ended_at)

    @admin.display(description="cut lateness")
    def lateness(self, obj: InferenceCall) -> str:
        return _lateness(obj)

    @admin.display(description="error")
    def error_text(self, obj: InferenceCall) -> Any:
        return error_html(obj.error)

    @admin.display(description="timeline")
    def timeline(self, obj: InferenceCall) -> SafeString:
        return _picture(obj, small=False)

    @admin.display(description="tokens in / out")
    def tokens(self, obj: InferenceCall) -> str:
        return tokens_shown(obj)
