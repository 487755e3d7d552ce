"""What a provider row may point at and which secret it may send (API.md, Providers).

- ``base_url``: http or https, no ``user:password@``, and a host that resolves only to
  addresses the provider policy allows: never link-local, multicast, reserved, unspecified or
  cloud-metadata; private and loopback only with ``AGENTOPS_PROVIDERS_ALLOW_PRIVATE=true``
  (the stand-in provider in tests and ``make run`` listens on loopback). The resolver is the
  webhooks' (``agentops.urlsafety``).
- ``api_key_env``: the name of an environment variable the operator allows
  (``AGENTOPS_PROVIDER_KEY_ENVS``, comma-separated; unset: any name ending in ``_API_KEY``), so
  a provider row can never make the worker send ``DATABASE_URL`` or another secret as a key;
  and one that is set in the service's environment (an unset one would send no key at all).

At creation the URL's form and an address written in it are checked, and the key variable;
a host name is resolved only when it is called (DNS may not answer where the provider is
created, and a name can resolve elsewhere later anyway). Before every call everything is
checked again, the name resolved, and the call connects to the addresses that were checked.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import re
from urllib.parse import urlsplit

from django.conf import settings

from .text import redact_secrets
from .urlsafety import METADATA, HostUnresolved, Policy, Vetted, url_form_refusal, url_vet

PROVIDERS = Policy(
    who="providers",
    setting="AGENTOPS_PROVIDERS_ALLOW_PRIVATE",
    always_refused=frozenset({"link-local", "multicast", "reserved", "unspecified", METADATA}),
)
DEFAULT_KEY_ENVS = "*_API_KEY"


def _key_env_patterns() -> list[str]:
    return [
        p.strip()
        for p in (settings.AGENTOPS_PROVIDER_KEY_ENVS or DEFAULT_KEY_ENVS).split(",")
        if p.strip()
    ]


@functools.lru_cache(maxsize=8)
def _key_env_names(patterns: str) -> re.Pattern[str]:
    return re.compile("|".join(fnmatch.translate(p) for p in patterns.split(",") if p.strip()))


def provider_keys() -> tuple[str, ...]:
    """Every key a provider may send now: the values of the environment variables
    ``AGENTOPS_PROVIDER_KEY_ENVS`` allows. Each provider's ``api_key_env`` is one of them, so
    this holds every configured provider's key (and no row has to be read); longest first, so
    a key that begins another is redacted after it."""
    named = _key_env_names(settings.AGENTOPS_PROVIDER_KEY_ENVS or DEFAULT_KEY_ENVS).match
    # Names first, values only for the few that match: os.environ decodes what is read.
    keys = {os.environ[name] for name in os.environ if named(name)}
    return tuple(sorted((k for k in keys if k), key=len, reverse=True))


def secrets_redacted(text: str) -> str:
    """A provider's words (an error message, an error body, a stream's error frame, a header
    echoed into an error) as the service may store, log or relay them: every provider key
    (``provider_keys``) and every ``Bearer``/``x-api-key`` value replaced by ``[redacted]``
    (``agentops.text.redact_secrets``; architecture.md §15)."""
    return redact_secrets(text, provider_keys())


def key_env_problem(name: str) -> str | None:
    """Why a provider may not read its key from the variable ``name``, or None ("" is no key)."""
    if not name:
        return None
    allowed = _key_env_patterns()
    if any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed):
        return None
    return (
        f"{name!r} is not a variable providers may read their key from "
        f"(AGENTOPS_PROVIDER_KEY_ENVS allows {', '.join(allowed)})"
    )


def credentials_refusal(url: str) -> str | None:
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        return f"the URL does not parse: {exc}"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "must not carry credentials (user:password@); name the key's variable in api_key_env"
    return None


def base_url_vet(url: str, *, unresolved_refused: bool = True) -> Vetted:
    """Check ``url`` against the provider policy, resolving its host once (blocking DNS: call
    it outside a transaction). A URL that may be called comes back with the addresses to
    connect to. A host that does not resolve is refused (nothing could be called there), or
    with ``unresolved_refused=False`` raises HostUnresolved (at call time DNS may be down for a
    while: the call fails as a network error, and is retried)."""
    refusal = credentials_refusal(url)
    if refusal:
        return Vetted(refusal)
    try:
        return url_vet(
            url, allow_private=settings.AGENTOPS_PROVIDERS_ALLOW_PRIVATE, policy=PROVIDERS
        )
    except HostUnresolved as exc:
        if not unresolved_refused:
            raise
        return Vetted(str(exc)[:300])


def key_missing(name: str) -> str | None:
    """Why the variable ``name`` gives no key now (unset or empty), or None ("" asks for none)."""
    if not name or os.environ.get(name):
        return None
    return (
        f"{name} is not set in the service's environment (set it where the service runs, "
        "or leave api_key_env empty for a provider that takes no key)"
    )


def provider_problem(*, base_url: str, api_key_env: str) -> tuple[str, str] | None:
    """(field, problem) for the first rule a new provider row breaks, or None. No DNS: a host
    name is resolved and checked when it is called."""
    refusal = credentials_refusal(base_url) or url_form_refusal(
        base_url, allow_private=settings.AGENTOPS_PROVIDERS_ALLOW_PRIVATE, policy=PROVIDERS
    )
    if refusal:
        return "base_url", refusal
    problem = key_env_problem(api_key_env) or key_missing(api_key_env)
    if problem:
        return "api_key_env", problem
    return None
