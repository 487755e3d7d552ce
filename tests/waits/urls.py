"""URLs for the waits tests: the admin, and the waits router under /api/v1/ as API.md has it.

The waits router is mounted on a test API here so these tests do not depend on how the main
API is wired; ninja mounts one router on several APIs."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path
from ninja import NinjaAPI

from interfaces.api import errors
from interfaces.api.auth import TokenAuth
from interfaces.api.waits_routes import router

api = NinjaAPI(
    title="agentops waits (tests)",
    version="1",
    auth=TokenAuth(),
    urls_namespace="api-v1-waits-tests",
)
errors.install(api)
api.add_router("/waits", router)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", api.urls),
]
