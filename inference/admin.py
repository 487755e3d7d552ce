from __future__ import annotations

from django.contrib import admin

from agentops.admin import ReadOnlyAdmin

from .models import InferenceCall, Turn


class InferenceCallInline(admin.TabularInline):
    model = InferenceCall
    extra = 0
    can_delete = False
    show_change_link = True
    fields = (
        "kind", "model", "streamed", "sent_at", "first_content_at", "last_event_at", "ended_at",
        "model_events", "keepalives", "outcome", "bound", "bound_deadline", "cut_lateness_ms",
    )
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:  # type: ignore[no-untyped-def]
        return False


@admin.register(Turn)
class TurnAdmin(ReadOnlyAdmin):
    list_display = ("id", "agent", "status", "attempts", "rounds", "created_at", "ended_at")
    list_filter = ("status", "agent")
    inlines = [InferenceCallInline]
    exclude = ("trigger_rows",)


@admin.register(InferenceCall)
class InferenceCallAdmin(ReadOnlyAdmin):
    list_display = ("id", "agent", "turn", "kind", "model", "streamed", "outcome", "bound", "model_events", "keepalives", "sent_at")
    list_filter = ("kind", "outcome", "bound", "streamed")
