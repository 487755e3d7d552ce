"""Parsing of stand-in scenario strings (``NAME`` or ``NAME:k=v,k=v``).

The scenario table here is the single source of truth for which scenarios and
parameters exist; docs/standin.md
documents them for humans.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

ParamValue = int | float | str | dict[str, Any] | None

#: Values accepted by the ``form`` parameter of ``error`` (and its aliases).
ERROR_FORMS: tuple[str, ...] = (
    "none",
    "retry-after-ms",
    "retry-after",
    "retry-after-date",
    "body-ms",
    "body-s",
    "body-retry-delay",
    "frame",
    "llm-provider-retry-after",
    "llm-provider-retry-after-ms",
    "x-ms-retry-after-ms",
)

#: Alias name -> HTTP status used as the default ``status`` of ``error``.
ERROR_ALIASES: dict[str, int] = {"rate-limit": 429, "overloaded": 529, "server-error": 500}

#: Scenarios that only make sense streamed; non-streamed requests hang.
KEEPALIVE_SCENARIOS: tuple[str, ...] = ("pings", "comments", "empty-deltas")


class ScenarioError(ValueError):
    """A scenario string names an unknown scenario or carries a bad parameter."""


@dataclass(frozen=True)
class Param:
    """One scenario parameter: its default and the parser for its raw text."""

    default: ParamValue
    parse: Callable[[str], ParamValue]
    expects: str


def _int(minimum: int, maximum: int | None = None) -> Callable[[str], ParamValue]:
    def parse(raw: str) -> ParamValue:
        value = int(raw.strip())
        if value < minimum or (maximum is not None and value > maximum):
            raise ValueError(raw)
        return value

    return parse


def _float(raw: str) -> ParamValue:
    # Accepts negative numbers as well as "nan", "inf" and "-inf" on purpose.
    return float(raw.strip())


def _text(raw: str) -> ParamValue:
    return raw


def _nonempty_text(raw: str) -> ParamValue:
    if not raw:
        raise ValueError(raw)
    return raw


def _steps(raw: str) -> ParamValue:
    steps = raw.split("|")
    for step in steps:
        if not step or step.split(":", 1)[0] == "sequence":
            raise ValueError(raw)
        parse_scenario(step)  # a bad step is refused up front, naming the parameter
    return raw


def _form(raw: str) -> ParamValue:
    if raw not in ERROR_FORMS:
        raise ValueError(raw)
    return raw


def _json_object(raw: str) -> ParamValue:
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(raw)
    return value


NONNEG = "a non-negative integer"
POSITIVE = "a positive integer"


def _nonneg(default: int) -> Param:
    return Param(default, _int(0), NONNEG)


def _positive(default: int) -> Param:
    return Param(default, _int(1), POSITIVE)


def _answer_params() -> dict[str, Param]:
    return {
        "text": Param(None, _text, "text"),
        "chunks": _positive(3),
        "interval_ms": _nonneg(10),
        "delay_ms": _nonneg(0),
        # Input tokens reported as read from and written to the provider's prompt cache.
        "cache_read": _nonneg(0),
        "cache_write": _nonneg(0),
    }


def _keepalive_params() -> dict[str, Param]:
    return {"interval_ms": _positive(100), "duration_ms": _nonneg(600_000)}


def _error_params(default_status: int) -> dict[str, Param]:
    return {
        "status": Param(default_status, _int(400, 599), "an HTTP status between 400 and 599"),
        "times": Param(None, _int(0), NONNEG),
        "form": Param("none", _form, "one of " + ", ".join(ERROR_FORMS)),
        "wait_ms": Param(1000.0, _float, "a number (negative, nan and inf are allowed)"),
        "code": Param(None, _nonempty_text, "non-empty text"),
        "type": Param(None, _nonempty_text, "non-empty text"),
        "message": Param(None, _text, "text"),
        "size": Param(None, _int(0), NONNEG),
        "delay_ms": _nonneg(0),
    }


SCENARIOS: dict[str, dict[str, Param]] = {
    "answer": _answer_params(),
    "think": {
        **_answer_params(),
        "thinking_chunks": _positive(3),
        "silent_ms": _nonneg(0),
    },
    "tool": {
        "name": Param(None, _nonempty_text, "non-empty text"),
        "arguments": Param(None, _json_object, "a JSON object (percent-encode , and =)"),
        "interval_ms": _nonneg(10),
        "delay_ms": _nonneg(0),
    },
    "pings": _keepalive_params(),
    "comments": _keepalive_params(),
    "empty-deltas": _keepalive_params(),
    "silent": {},
    "silent-after-content": {
        "after_chunks": _nonneg(1),
        "interval_ms": _nonneg(10),
        "pings_ms": _nonneg(0),
    },
    "trickle": {
        "interval_ms": _positive(200),
        "bytes": _positive(1),
        "duration_ms": _nonneg(600_000),
    },
    "endless": {"interval_ms": _positive(20)},
    "error": _error_params(500),
    **{alias: _error_params(status) for alias, status in ERROR_ALIASES.items()},
    "refuse": {"message": Param(None, _text, "text")},
    "poison": {"marker": Param("POISON", _nonempty_text, "non-empty text")},
    "context-length": {},
    "compact": {},
    "window": {
        "tokens": _positive(16000),
        "text": Param(None, _text, "text"),
        "tool": Param(0, _int(0, 1), "0 or 1"),
        "refuse_marker": Param(None, _nonempty_text, "non-empty text"),
        "density": Param(1, _int(1, 8), "a whole number from 1 to 8"),
    },
    "auth": {},
    "length-empty": {},
    "hang": {},
    "sequence": {"steps": Param(None, _steps, "scenarios separated by |")},
}


@dataclass(frozen=True)
class Scenario:
    """A parsed scenario string.

    ``raw`` is the exact string (the key of the ``times`` counters), ``name``
    the scenario as written and ``kind`` the behaviour (aliases of ``error``
    have kind ``error``).
    """

    raw: str
    name: str
    kind: str
    params: Mapping[str, ParamValue] = field(default_factory=dict)

    def get_int(self, key: str) -> int:
        value = self.params[key]
        assert isinstance(value, int)
        return value

    def get_opt_int(self, key: str) -> int | None:
        value = self.params[key]
        assert value is None or isinstance(value, int)
        return value

    def get_float(self, key: str) -> float:
        value = self.params[key]
        assert isinstance(value, int | float)
        return float(value)

    def get_str(self, key: str) -> str:
        value = self.params[key]
        assert isinstance(value, str)
        return value

    def get_opt_str(self, key: str) -> str | None:
        value = self.params[key]
        assert value is None or isinstance(value, str)
        return value

    def get_opt_object(self, key: str) -> dict[str, Any] | None:
        value = self.params[key]
        assert value is None or isinstance(value, dict)
        return value

    def seconds(self, key: str) -> float:
        """A millisecond parameter in seconds (non-finite values become 0)."""
        value = self.get_float(key) / 1000.0
        return value if math.isfinite(value) else 0.0


def parse_scenario(raw: str) -> Scenario:
    """Parse ``NAME`` or ``NAME:k=v,k=v`` (values are percent-decoded).

    Raises :class:`ScenarioError` with a message naming the unknown scenario
    or the offending parameter.
    """
    text = raw.strip()
    name, _, rest = text.partition(":")
    name = name.strip()
    if not name:
        raise ScenarioError(f"empty stand-in scenario name in {raw!r}")
    spec = SCENARIOS.get(name)
    if spec is None:
        known = ", ".join(sorted(SCENARIOS))
        raise ScenarioError(f"unknown stand-in scenario {name!r} (known scenarios: {known})")
    params: dict[str, ParamValue] = {key: p.default for key, p in spec.items()}
    seen: set[str] = set()
    for item in rest.split(","):
        if not item.strip():
            continue
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise ScenarioError(
                f"parameter {item.strip()!r} of stand-in scenario {name!r} is not key=value"
            )
        param = spec.get(key)
        if param is None:
            accepted = ", ".join(spec) or "none"
            raise ScenarioError(
                f"unknown parameter {key!r} for stand-in scenario {name!r} (accepted: {accepted})"
            )
        if key in seen:
            raise ScenarioError(f"parameter {key!r} given twice for stand-in scenario {name!r}")
        seen.add(key)
        decoded = unquote(value)
        try:
            params[key] = param.parse(decoded)
        except ValueError:
            raise ScenarioError(
                f"bad value {decoded!r} for parameter {key!r} of stand-in scenario {name!r}: "
                f"expected {param.expects}"
            ) from None
    kind = "error" if name in ERROR_ALIASES else name
    return Scenario(raw=raw, name=name, kind=kind, params=params)
