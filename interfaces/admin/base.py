"""What every app's admin pages share (architecture.md §9), kept apart from
``interfaces.admin.core`` (the core records' pages, which read from every app) so that any app's
admin can use it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from interfaces.edge import runtime_of
from turns.runtime import TurnRuntime


class RuntimeReadsAdmin(admin.ModelAdmin):
    """A change page whose display methods show what the process's runtime reads of the row
    (its pacer's view of a provider, an agent's routing choice): a display method is handed the
    row, not the request that carries the runtime, so ``runtime_reads`` puts those reads on the
    row as the page fetches it."""

    def get_object(
        self, request: HttpRequest, object_id: str, from_field: str | None = None
    ) -> Any:
        obj = super().get_object(request, object_id, from_field)
        if obj is not None:
            self.runtime_reads(runtime_of(request), obj)
        return obj

    def runtime_reads(self, rt: TurnRuntime, obj: Any) -> None:
        raise NotImplementedError


class ReadOnlyAdmin(admin.ModelAdmin):
    """A record: nobody adds, edits or deletes it through the admin."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
