"""Typed environment helpers: each refuses a bad value with a message that names the variable.

Settings are read and validated here, once, at import of ``agentops.settings``.
"""

from __future__ import annotations

import math
import os


class ConfigError(ValueError):
    """A setting from the environment is malformed; startup stops with its message."""


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


def env_ms(name: str, default: float) -> float:
    """A positive finite number of milliseconds."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a positive number of milliseconds, not {raw!r}") from None
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
