"""Typed environment helpers: each refuses a bad value with a message that names the variable.

Settings are read and validated here, once, at import of ``agentops.settings``. A refused
setting stops any process (the web app, a worker, beat, a management command) with one line on
stderr, last, and exit status 2, not a traceback: see ``_refused``.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import sys
from types import TracebackType
from typing import Any


class ConfigError(ValueError):
    """A setting from the environment is malformed; startup stops with its message."""


def _refused(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    """An uncaught ``ConfigError`` (raised while settings load, in any process) ends the process
    with its one line; any other exception is reported as Python reports it."""
    if not isinstance(value, ConfigError):
        _python_excepthook(kind, value, tb)
        return
    sys.stdout.flush()
    print(f"agentops: configuration error: {value}", file=sys.stderr, flush=True)
    os._exit(2)  # (an excepthook cannot choose the exit status otherwise)


_python_excepthook = sys.excepthook
sys.excepthook = _refused


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int, *, minimum: int = 0, maximum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, not {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, not {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be at most {maximum}, not {value}")
    return value


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    if raw.strip().lower() not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, not {raw!r}")
    return raw.strip().lower()


def env_time_zone(name: str, default: str) -> str:
    """An IANA time zone name (e.g. "Europe/Paris"); refused at startup when unknown."""
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    raw = os.environ.get(name, "").strip() or default
    try:
        ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            f"{name} must be an IANA time zone name (e.g. UTC), not {raw!r}"
        ) from None
    return raw


def env_port(name: str, default: int, *, any_free: bool = False) -> int:
    """A TCP port, 1-65535 (0 too with ``any_free``: the system picks a free one)."""
    return env_int(name, default, minimum=0 if any_free else 1, maximum=65535)


def env_ms(name: str, default: float) -> float:
    """A positive finite number of milliseconds."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(
            f"{name} must be a positive number of milliseconds, not {raw!r}"
        ) from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive number of milliseconds, not {raw!r}")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name} must be true or false, not {raw!r}")


def env_ms_list(name: str, default: tuple[float, ...]) -> tuple[float, ...]:
    """A comma-separated list of positive finite milliseconds."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    values = []
    for part in raw.split(","):
        try:
            value = float(part)
        except ValueError:
            raise ConfigError(f"{name} must be comma-separated milliseconds, not {raw!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise ConfigError(f"{name} must be comma-separated positive milliseconds, not {raw!r}")
        values.append(value)
    return tuple(values)


# The absolute call bound's default (calls.bounds), which settings derive other bounds from.
ABSOLUTE_MS_DEFAULT = 75 * 60_000

# AGENTOPS_INFERENCE_BOUNDS (architecture.md §5.4): its sections and fields.
BOUNDS_FIELDS = {
    "progress_bounds": ("before_content_ms", "between_events_ms", "think_tokens_per_second"),
    "": ("flat_minimum_ms", "absolute_ms"),
}


def bounds_values(raw: Any, name: str = "AGENTOPS_INFERENCE_BOUNDS") -> dict[str, float] | None:
    """The inference bounds setting (a JSON string, a dict, ``False``, ``None`` or ``""``) as
    the fields it sets, ``{}`` for every default, None for bounds off. Raises ConfigError
    naming the field: a value that is not a positive finite number, a section that is not an
    object, a key the setting does not have."""
    if isinstance(raw, str):
        if raw.strip() == "":
            return {}
        try:
            raw = json.loads(raw)
        except ValueError:
            raise ConfigError(f"{name} must be JSON or false, not {raw!r}") from None
    if raw is False:
        return None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{name} must be an object or false, not {json.dumps(raw)}")
    _known_keys(raw, name, [*BOUNDS_FIELDS[""], "progress_bounds"])
    values: dict[str, float] = {}
    for section, fields in BOUNDS_FIELDS.items():
        container: Any = raw
        if section:
            container = raw.get(section)
            if container is None:
                continue
            if not isinstance(container, dict):
                raise ConfigError(
                    f"{name}.{section} must be an object, not {json.dumps(container)}"
                )
            _known_keys(container, f"{name}.{section}", list(fields))
        for field in fields:
            value = container.get(field)
            if value is None:
                continue
            path = ".".join(p for p in (name, section, field) if p)
            unit = "tokens per second" if field == "think_tokens_per_second" else "milliseconds"
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not _positive_finite(value)
            ):
                shown = json.dumps(value) if not isinstance(value, float) else repr(value)
                raise ConfigError(f"{path} must be a positive number of {unit}, not {shown}")
            values[field] = float(value)
    return values


def _known_keys(given: dict[str, Any], where: str, known: list[str]) -> None:
    """A key a setting does not have is refused: a typo would leave its default running."""
    for key in given:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise ConfigError(
                f"{where}.{key} is not a setting ({hint}the settings there: {', '.join(known)})"
            )


def _positive_finite(value: float) -> bool:
    try:
        number = float(value)  # an integer too large for a float overflows here
    except OverflowError:
        return False
    return math.isfinite(number) and number > 0
