"""System checks of the service's own (``manage.py check``)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.middleware.clickjacking import XFrameOptionsMiddleware
from django.middleware.csrf import CsrfViewMiddleware
from django.middleware.security import SecurityMiddleware
from django.utils.module_loading import import_string

# What Django's deploy checks W001-W003 ask for, met by the edge's subclasses of them.
GUARDS = (SecurityMiddleware, XFrameOptionsMiddleware, CsrfViewMiddleware)


@checks.register(checks.Tags.security, deploy=True)
def check_edge_guards(**kwargs: Any) -> list[checks.CheckMessage]:
    """The security, clickjacking and CSRF middleware, as Django's own or a subclass: the three
    deploy checks silenced in the settings (they look for Django's dotted paths only)."""
    installed = [import_string(path) for path in settings.MIDDLEWARE]
    missing = [
        guard
        for guard in GUARDS
        if not any(isinstance(m, type) and issubclass(m, guard) for m in installed)
    ]
    return [
        checks.Error(
            f"{guard.__module__}.{guard.__name__} (or a subclass) is not in MIDDLEWARE",
            id="agentops.E003",
        )
        for guard in missing
    ]
