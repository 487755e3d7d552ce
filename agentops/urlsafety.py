"""Which URLs the service will send to, and where a request connects (architecture.md §8): the one
resolver and address policy behind webhooks and providers.

Only http and https. Unless private addresses are allowed (``AGENTOPS_WEBHOOKS_ALLOW_PRIVATE``,
``AGENTOPS_PROVIDERS_ALLOW_PRIVATE``), a host must resolve to public addresses only: a URL that
points at loopback, a private range, link-local (cloud metadata at 169.254.169.254), multicast,
reserved or unspecified addresses would let whoever edits it make the service probe its own
network. A policy may refuse some kinds even when private addresses are allowed
(``always_refused``: providers never go to link-local, multicast, reserved, unspecified or
cloud-metadata addresses). The check runs when a URL is saved and again before every request,
because what a name resolves to can change after it was saved.

An attempt resolves the host once (``url_vet``) and connects to the addresses it checked: if
the sender let the HTTP client resolve the name again, a name that answered with a public
address for the check could answer with a private one for the connection (DNS rebinding).
"""

from __future__ import annotations

import contextvars
import ipaddress
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

SCHEMES = ("http", "https")
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class HostUnresolved(OSError):
    """The URL's host did not resolve (which may pass: DNS can be down for a while)."""


# Answers looked up ahead of a transaction (see ``resolved_ahead``), by (host, port).
_ahead: contextvars.ContextVar[dict[tuple[str, int], list[IPAddress] | HostUnresolved] | None] = (
    contextvars.ContextVar("webhook_hosts_resolved_ahead", default=None)
)


@dataclass(frozen=True)
class Vetted:
    refusal: str | None  # why the service must not send to the URL; None if it may
    addresses: tuple[IPAddress, ...] = ()  # what the host resolved to, every one allowed


# Cloud metadata services (AWS, GCP and Azure at 169.254.169.254, AWS over IPv6, ECS task
# metadata, Alibaba): refused wherever ``METADATA`` is in a policy's ``always_refused``.
METADATA = "cloud-metadata"
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200")
)


@dataclass(frozen=True)
class Policy:
    """Who sends (for messages), the setting that allows private addresses, and the kinds of
    address refused even then."""

    who: str
    setting: str
    always_refused: frozenset[str] = frozenset()


WEBHOOKS = Policy(who="webhooks", setting="AGENTOPS_WEBHOOKS_ALLOW_PRIVATE")


def url_refusal(url: str, *, allow_private: bool, policy: Policy = WEBHOOKS) -> str | None:
    """Why the service must not send to ``url``, or None if it may. Resolves the host (blocking
    DNS: never call it inside a transaction, unless within ``resolved_ahead``) unless private
    addresses are allowed. Raises HostUnresolved when the host does not resolve."""
    _, refusal = _parts(url)
    if refusal or (allow_private and not policy.always_refused):
        return refusal
    return url_vet(url, allow_private=allow_private, policy=policy).refusal


def url_vet(url: str, *, allow_private: bool, policy: Policy = WEBHOOKS) -> Vetted:
    """Resolve ``url``'s host once and check every address it resolves to. A URL that may be
    sent to comes back with those addresses: connect to them, not to the name. Blocking DNS:
    never call it inside a transaction. Raises HostUnresolved when the host does not resolve."""
    parts, refusal = _parts(url)
    if refusal:
        return Vetted(refusal)
    assert parts is not None and parts.hostname
    host = parts.hostname
    addresses = _resolve(host, parts.port or (443 if parts.scheme.lower() == "https" else 80))
    for address in addresses:
        refusal = _address_refusal(
            f"{host} resolves to {address}", address, allow_private=allow_private, policy=policy
        )
        if refusal:
            return Vetted(refusal)
    return Vetted(None, tuple(addresses))


def url_form_refusal(url: str, *, allow_private: bool, policy: Policy) -> str | None:
    """Why ``url`` may never be sent to, judged without DNS: its form, and its host when that
    is an address. None for a host name (what it resolves to is checked before each request)."""
    parts, refusal = _parts(url)
    if refusal:
        return refusal
    assert parts is not None and parts.hostname
    try:
        address = ipaddress.ip_address(parts.hostname)
    except ValueError:
        return None
    return _address_refusal(f"{address} is", address, allow_private=allow_private, policy=policy)


def _address_refusal(
    what: str, address: IPAddress, *, allow_private: bool, policy: Policy
) -> str | None:
    kind = _non_public(address)
    if METADATA in policy.always_refused and address in METADATA_ADDRESSES:
        kind = METADATA
    if kind in policy.always_refused:
        return f"{what}, a {kind} address; {policy.who} never go to one"
    if kind and not allow_private:
        return (
            f"{what}, a {kind} address; {policy.who} go to public addresses only "
            f"(set {policy.setting}=true to allow private ones)"
        )
    return None


@contextmanager
def resolved_ahead(url: str) -> Iterator[None]:
    """Resolve ``url``'s host now, and let checks of that host within the block use this answer
    instead of asking DNS again: for a caller that must check a URL inside a transaction it did
    not open (the admin's), so the lookup happens before the transaction starts."""
    answers: dict[tuple[str, int], list[IPAddress] | HostUnresolved] = dict(_ahead.get() or {})
    parts, refusal = _parts(url)
    if parts is not None and parts.hostname and not refusal:
        key = (parts.hostname, parts.port or (443 if parts.scheme.lower() == "https" else 80))
        try:
            answers[key] = _resolve(*key)
        except HostUnresolved as exc:
            answers[key] = exc
    token = _ahead.set(answers)
    try:
        yield
    finally:
        _ahead.reset(token)


def url_for_log(url: str) -> str:
    """``url`` without its credentials (user:password@), query and fragment, which may carry
    tokens: the form for logs, audit entries and messages."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "(a URL that does not parse)"
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{port}" if port is not None else host
    return SplitResult(parts.scheme, netloc, parts.path, "", "").geturl()


def _parts(url: str) -> tuple[SplitResult | None, str | None]:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port out of range
    except ValueError as exc:
        return None, f"the URL does not parse: {exc}"
    if parts.scheme.lower() not in SCHEMES:
        return (
            None,
            f"only http and https URLs are allowed, not {parts.scheme or 'a URL without a scheme'}",
        )
    if not parts.hostname:
        return None, "the URL has no host"
    return parts, None


def _resolve(host: str, port: int) -> list[IPAddress]:
    ahead = (_ahead.get() or {}).get((host, port))
    if isinstance(ahead, HostUnresolved):
        raise ahead
    if ahead is not None:
        return ahead
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise HostUnresolved(f"{host} does not resolve: {exc}") from exc
    addresses: list[IPAddress] = []
    for info in infos:
        raw = str(info[4][0]).split("%", 1)[0]  # drop an IPv6 zone id
        address = ipaddress.ip_address(raw)
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise HostUnresolved(f"{host} resolves to no address")
    return addresses


def _non_public(address: IPAddress) -> str | None:
    """The kind of a non-public address, or None for a public one. An IPv6 address that embeds
    an IPv4 one (mapped, 6to4, NAT64) is judged by the address it carries."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None:
            return _non_public(embedded)
    for kind in ("loopback", "unspecified", "link_local", "multicast", "reserved", "private"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    if not address.is_global:  # shared address space (100.64/10) and the like
        return "non-global"
    return None
