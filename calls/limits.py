"""Where a provider's limit binds, and what it says is left (architecture.md §6.12, §6.13).

Pure: headers, bodies and ``now`` come in; plain values go out.

- ``quota_from_headers``: the remaining-quota headers every large provider sends on every
  answer (OpenAI and Azure ``x-ratelimit-*``, Anthropic ``anthropic-ratelimit-*``), as a
  ``Quota`` with absolute reset instants.
- ``limit_scope``: whom a refusal binds, from the provider's own words (the wordings table of
  §6.12) and its headers: one agent, every agent on the provider's model, or the account.
- ``acceleration_cooldown``: the seeds' organization-acceleration cooldown.
"""

from __future__ import annotations

import calendar
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

Scope = Literal["agent", "model", "provider"]

# The service's own acceleration pacing is capped here; a stated wait is not (the seeds).
OWN_COOLDOWN_CAP_MS: Final = 600_000
COOLDOWN_FLOOR_MS: Final = 1_000


@dataclass(frozen=True, slots=True)
class Quota:
    """What a provider's answer said is left for its (account, model), each None when not
    said: requests and tokens, their limits and when each resets (ms since the epoch)."""

    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset_ms: float | None = None
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset_ms: float | None = None

    @property
    def exhausted(self) -> bool:
        """Whether it says nothing is left (a request or a token) until a reset."""
        return self.requests_remaining == 0 or self.tokens_remaining == 0


# Looked up first: an answer with none of these has no quota headers (the usual case off the
# large providers), and costs this module two dictionary lookups.
_MARKERS: Final = ("x-ratelimit-remaining-requests", "anthropic-ratelimit-requests-remaining")
_OPENAI: Final = "x-ratelimit-{what}-{kind}"
_ANTHROPIC: Final = "anthropic-ratelimit-{kind}-{what}"
_ANTHROPIC_TOKENS: Final = ("tokens", "input-tokens", "output-tokens")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")


def quota_from_headers(headers: Mapping[str, str], now_ms: float) -> Quota | None:
    """The remaining-quota headers of an answer, or None when it has none. ``headers`` looks
    names up case-insensitively (aiohttp's) or has them in lower case."""
    get = headers.get
    if get(_MARKERS[0]) is None and get(_MARKERS[1]) is None and not _any_tokens(headers):
        return None
    if any(name.startswith("x-ratelimit-") for name in _names(headers)):
        return Quota(
            requests_limit=_count(get("x-ratelimit-limit-requests")),
            requests_remaining=_count(get("x-ratelimit-remaining-requests")),
            requests_reset_ms=_openai_reset(get("x-ratelimit-reset-requests"), now_ms),
            tokens_limit=_count(get("x-ratelimit-limit-tokens")),
            tokens_remaining=_count(get("x-ratelimit-remaining-tokens")),
            tokens_reset_ms=_openai_reset(get("x-ratelimit-reset-tokens"), now_ms),
        )
    # Anthropic counts tokens three ways; the scarcest binds the next call.
    tokens = [
        (
            _count(get(_ANTHROPIC.format(kind=kind, what="remaining"))),
            _count(get(_ANTHROPIC.format(kind=kind, what="limit"))),
            _instant_ms(get(_ANTHROPIC.format(kind=kind, what="reset"))),
        )
        for kind in _ANTHROPIC_TOKENS
    ]
    known = [t for t in tokens if t[0] is not None]
    scarcest = min(known, key=lambda t: t[0] or 0) if known else (None, None, None)
    return Quota(
        requests_limit=_count(get("anthropic-ratelimit-requests-limit")),
        requests_remaining=_count(get("anthropic-ratelimit-requests-remaining")),
        requests_reset_ms=_instant_ms(get("anthropic-ratelimit-requests-reset")),
        tokens_limit=scarcest[1],
        tokens_remaining=scarcest[0],
        tokens_reset_ms=scarcest[2],
    )


def _any_tokens(headers: Mapping[str, str]) -> bool:
    return (
        headers.get("x-ratelimit-remaining-tokens") is not None
        or headers.get("anthropic-ratelimit-tokens-remaining") is not None
        or headers.get("anthropic-ratelimit-input-tokens-remaining") is not None
    )


def _names(headers: Mapping[str, str]) -> list[str]:
    return [name.lower() for name in headers]


def _count(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        count = int(value.strip())
    except ValueError:
        return None
    return count if 0 <= count < 2**63 else None


def _openai_reset(value: str | None, now_ms: float) -> float | None:
    """OpenAI's reset: a duration (``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``) or a number of
    seconds, as the instant it ends."""
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            return None
        scale = {"h": 3_600_000.0, "m": 60_000.0, "s": 1_000.0, "ms": 1.0}
        ms = sum(float(n) * scale[u] for n, u in parts)
    else:
        ms = seconds * 1000
    return now_ms + ms if math.isfinite(ms) and ms >= 0 else None


def _instant_ms(value: str | None) -> float | None:
    """Anthropic's reset: an RFC 3339 instant."""
    if value is None:
        return None
    try:
        instant = datetime.fromisoformat(value.strip())
    except ValueError:
        return None
    if instant.tzinfo is None:
        instant = instant.replace(tzinfo=UTC)
    return instant.timestamp() * 1000


# --- the wordings (architecture.md §6.12's table) ------------------------------------------

# A spent credit or a spend cap: the whole account stops.
SPEND_CODES: Final = frozenset(
    {
        "insufficient_quota",
        "credit_balance_exhausted",
        "organization_usage_limit_exceeded",
        "organization_spend_limit_exceeded",
        "project_spend_limit_exceeded",
        "enforced_spend_limit_reached",
        "billing_hard_limit_reached",
    }
)
# Anthropic's spend cap waits for the first of the next month (00:00 UTC) unless it says.
MONTHLY_CODES: Final = frozenset({"enforced_spend_limit_reached"})
_SPEND_WORDS = re.compile(r"you have reached your specified (workspace )?API usage limits", re.I)
_ACCELERATION = re.compile(r"\bacceleration\b", re.I)
# An organization's (or deployment's) limit for a model, in each provider's words.
_MODEL_WORDS = re.compile(
    r"rate limit reached for .+ in (organization|project)"  # OpenAI
    r"|in (organization|project) \S+ on (requests|tokens)"  # OpenAI, another form
    r"|exceeded (the )?(token |call )?rate limit"  # Azure OpenAI
    r"|would exceed the rate limit for your organization"  # Anthropic
    r"|exceeded your (per-minute|organization's) rate limit"  # Anthropic
    r"|per[- ]minute rate limit"  # Anthropic
    r"|RESOURCE_EXHAUSTED|quota exceeded for (quota )?metric",  # Gemini
    re.I,
)


@dataclass(frozen=True, slots=True)
class Scoped:
    """Whom a refusal binds. ``acceleration``: the seeds' cooldown applies. ``monthly``: a
    spend cap that lasts until the first of the next month unless a wait is stated."""

    scope: Scope = "agent"
    acceleration: bool = False
    spend: bool = False
    monthly: bool = False


AGENT_SCOPE: Final = Scoped()


def limit_scope(
    *, throttled: bool, codes: tuple[Any, ...], message: str, quota: Quota | None
) -> Scoped:
    """Whom a refusal binds. ``throttled``: classified as a rate limit or a quota (a 429,
    or a body that says so); ``codes``: the provider's code, type and detail codes."""
    named = {c for c in codes if isinstance(c, str)}
    if named & SPEND_CODES or _SPEND_WORDS.search(message):
        return Scoped("provider", spend=True, monthly=bool(named & MONTHLY_CODES))
    if not throttled:
        return AGENT_SCOPE
    if _ACCELERATION.search(message):
        return Scoped("provider", acceleration=True)
    if _MODEL_WORDS.search(message) or (quota is not None and quota.exhausted):
        return Scoped("model")
    return AGENT_SCOPE


def next_month_ms(now_ms: float) -> float:
    """The first instant of the next month, UTC: when a monthly spend cap lifts."""
    now = datetime.fromtimestamp(now_ms / 1000, UTC)
    year, month = (now.year + 1, 1) if now.month == 12 else (now.year, now.month + 1)
    return calendar.timegm((year, month, 1, 0, 0, 0)) * 1000.0


@dataclass(frozen=True, slots=True)
class Cooldown:
    """An acceleration cooldown: until when (None: until released), when the service's own
    pacing would end it, and whether a stated wait made it longer than that."""

    until: float | None
    own_until: float
    lengthened: bool


def acceleration_cooldown(
    *, now_ms: float, stated_ms: float | None, own_ms: float, jitter_ms: float, jitter: float
) -> Cooldown:
    """The seeds' rule. Without a stated wait: the service's own pacing, ``own_ms`` plus
    ``jitter`` (0..1) of ``jitter_ms``, capped at 10 minutes. With one: the stated wait (a
    negative counts as 0) with a 1 s floor, plus the jitter, never capped; not a finite number:
    until released."""
    own_until = now_ms + min(own_ms + jitter * jitter_ms, OWN_COOLDOWN_CAP_MS)
    if stated_ms is None:
        return Cooldown(until=own_until, own_until=own_until, lengthened=False)
    if not math.isfinite(stated_ms):
        return Cooldown(until=None, own_until=own_until, lengthened=True)
    until = now_ms + max(stated_ms, 0.0, COOLDOWN_FLOOR_MS) + jitter * jitter_ms
    return Cooldown(until=until, own_until=own_until, lengthened=until > own_until)
