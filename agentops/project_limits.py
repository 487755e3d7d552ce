"""Project limits (architecture.md §6.14): the requests and tokens per minute and the calls at
once an operator allows a project's agents, as values, checked and written here (audited).
Enforcing them on every call is ``calls.project_limits``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from django.db import transaction
from django.utils import timezone

from agentops.exceptions import bad_field
from agentops.models import AuditEntry, Project

# The largest value each limit takes. Requests per minute are a moving window in Redis, one
# list entry per request in the window: this bounds the list.
LIMIT_MAXIMA: Final = {
    "requests_per_minute": 100_000,
    "tokens_per_minute": 1_000_000_000,
    "concurrent_calls": 10_000,
}
LIMITS_SHAPE: Final = "{requests_per_minute?, tokens_per_minute?, concurrent_calls?}"


@dataclass(frozen=True, slots=True)
class ProjectLimits:
    """A project's limits; None: that one is not limited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_calls: int | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in self.as_dict().values())

    def as_dict(self) -> dict[str, int | None]:
        return {
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
            "concurrent_calls": self.concurrent_calls,
        }


def check_limits(body: dict[str, Any]) -> ProjectLimits:
    """The limits a request body states (an absent or null field: not limited), or a 400 naming
    the first field that is not a whole number from 1 to its maximum."""
    values: dict[str, int | None] = {}
    for field, maximum in LIMIT_MAXIMA.items():
        value = body.get(field)
        if value is None:
            values[field] = None
            continue
        # JSON's true is Python's 1, and 5.0 a float: neither is a count.
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad_field(field, "must be a whole number (or null: no limit)")
        if not 1 <= value <= maximum:
            raise bad_field(field, f"must be from 1 to {maximum} (or null: no limit)")
        values[field] = value
    return ProjectLimits(**values)


def project_limits_of(project: Project) -> ProjectLimits:
    return ProjectLimits(
        requests_per_minute=project.requests_per_minute,
        tokens_per_minute=project.tokens_per_minute,
        concurrent_calls=project.concurrent_calls,
    )


def project_limits_put(*, project: Project, limits: ProjectLimits, actor: str) -> ProjectLimits:
    """Set ``project``'s limits to exactly ``limits`` (in place of any earlier ones), audited.
    Every process enforces them within ``calls.project_limits.KNOWN_S``."""
    with transaction.atomic():
        locked = Project.objects.select_for_update().get(pk=project.pk)
        before = project_limits_of(locked)
        for field, value in limits.as_dict().items():
            setattr(locked, field, value)
        locked.limits_set_at = timezone.now() if limits.any else None
        locked.save(update_fields=[*LIMIT_MAXIMA, "limits_set_at"])
        AuditEntry.objects.create(
            actor=actor,
            action="project.limits-set",
            target=f"project:{locked.name}",
            data={"limits": limits.as_dict(), "before": before.as_dict()},
        )
    return limits


def project_limits_clear(*, project: Project, actor: str) -> bool:
    """Lift every limit of ``project``, audited; False (nothing written) when it had none."""
    with transaction.atomic():
        locked = Project.objects.select_for_update().get(pk=project.pk)
        before = project_limits_of(locked)
        if not before.any:
            return False
        for field in LIMIT_MAXIMA:
            setattr(locked, field, None)
        locked.limits_set_at = None
        locked.save(update_fields=[*LIMIT_MAXIMA, "limits_set_at"])
        AuditEntry.objects.create(
            actor=actor,
            action="project.limits-clear",
            target=f"project:{locked.name}",
            data={"before": before.as_dict()},
        )
    return True
