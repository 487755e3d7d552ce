"""What every app's admin pages share (architecture.md §9), kept apart from
``interfaces.admin.core`` (the core records' pages, which read from every app) so that any app's
admin can use it."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest


class ReadOnlyAdmin(admin.ModelAdmin):
    """A record: nobody adds, edits or deletes it through the admin."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
