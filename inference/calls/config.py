"""Reading AGENTOPS_INFERENCE_BOUNDS (DESIGN §5.4) and its system check."""

from __future__ import annotations

import json
import math
from functools import cache
from typing import Any

from django.conf import settings
from django.core import checks

from .bounds import BoundsSettings

_FIELDS = {
    "progress_bounds": ("before_content_ms", "between_events_ms", "think_tokens_per_second"),
    "": ("flat_minimum_ms", "absolute_ms"),
}
PREFIX = "AGENTOPS_INFERENCE_BOUNDS"


class BoundsConfigError(ValueError):
    pass


def parse_bounds(raw: Any) -> BoundsSettings | None:
    """``raw`` is the Django setting: a JSON string, a dict, ``False``, ``None`` or ``""``.

    Returns None when bounds are off. Raises BoundsConfigError naming the field.
    """
    if isinstance(raw, str):
        if raw.strip() == "":
            return BoundsSettings()
        try:
            raw = json.loads(raw)
        except ValueError:
            raise BoundsConfigError(f"{PREFIX} must be JSON or false, not {raw!r}") from None
    if raw is False:
        return None
    if raw is None:
        return BoundsSettings()
    if not isinstance(raw, dict):
        raise BoundsConfigError(f"{PREFIX} must be an object or false, not {json.dumps(raw)}")
    values: dict[str, float] = {}
    for section, names in _FIELDS.items():
        container: Any = raw
        if section:
            container = raw.get(section)
            if container is None:
                continue
            if not isinstance(container, dict):
                raise BoundsConfigError(
                    f"{PREFIX}.{section} must be an object, not {json.dumps(container)}"
                )
        for name in names:
            value = container.get(name)
            if value is None:
                continue
            path = ".".join(p for p in (PREFIX, section, name) if p)
            unit = "tokens per second" if name == "think_tokens_per_second" else "milliseconds"
            if isinstance(value, bool) or not isinstance(value, int | float) or not _positive_finite(value):
                shown = json.dumps(value) if not isinstance(value, float) else repr(value)
                raise BoundsConfigError(f"{path} must be a positive number of {unit}, not {shown}")
            values[name] = float(value)
    return BoundsSettings(**values)


def _positive_finite(value: float) -> bool:
    try:
        number = float(value)  # an integer too large for a float overflows here
    except OverflowError:
        return False
    return math.isfinite(number) and number > 0


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
