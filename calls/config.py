"""Reading AGENTOPS_INFERENCE_BOUNDS (architecture.md §5.4) and its system check."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.conf import settings
from django.core import checks

from agentops.conf import ConfigError, bounds_values
from calls.bounds import BoundsSettings

PREFIX = "AGENTOPS_INFERENCE_BOUNDS"
# Refused with the setting's name and field (the validation is the settings', agentops.conf).
BoundsConfigError = ConfigError


def parse_bounds(raw: Any) -> BoundsSettings | None:
    """``raw`` is the Django setting: a JSON string, a dict, ``False``, ``None`` or ``""``.

    Returns None when bounds are off. Raises BoundsConfigError naming the field.
    """
    values = bounds_values(raw, PREFIX)
    return None if values is None else BoundsSettings(**values)


@cache
def bounds_settings() -> BoundsSettings | None:
    return parse_bounds(settings.AGENTOPS_INFERENCE_BOUNDS)


@checks.register()
def check_inference_bounds(**kwargs: Any) -> list[checks.CheckMessage]:
    try:
        parse_bounds(settings.AGENTOPS_INFERENCE_BOUNDS)
    except BoundsConfigError as exc:
        return [checks.Error(str(exc), id="agentops.E001")]
    return []
