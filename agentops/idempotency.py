"""Idempotency keys (architecture.md §14.2, API.md "Idempotency-Key"): a request sent with the
header is claimed here before any provider call; a repeat is answered from the record.

The race between two duplicates is decided by PostgreSQL: the row is inserted under the unique
constraint (token, key), so exactly one insert wins and only its request calls the provider; the
other finds the row, in flight (409) or answered (replayed). A row left in flight past
``AGENTOPS_IDEMPOTENCY_INFLIGHT_MS`` was abandoned (its web process died mid-request): the next
repeat replaces it (a conditional delete, then its own insert, which again only one of two can
win), so the first process, were it only slow, finds its claim gone."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from agentops.exceptions import BadRequest, Conflict, Unprocessable
from agentops.models import IdempotencyKey

HEADER = "Idempotency-Key"
KEY_MAX = 255
REPLAYED_HEADER = "idempotent-replayed"
# A provider's answer of these is a transient failure: a retry should call again.
TRANSIENT = frozenset({408, 409, 429})


def idempotency_key_check(value: str | None) -> str | None:
    """The header's value, or None when it was not sent. Raises BadRequest naming the header
    when it is empty, longer than ``KEY_MAX`` or holds a control character."""
    if value is None:
        return None
    if not value.strip():
        raise BadRequest(f"{HEADER}: must not be empty", data={"field": HEADER})
    if len(value) > KEY_MAX:
        raise BadRequest(
            f"{HEADER}: at most {KEY_MAX} characters, got {len(value)}", data={"field": HEADER}
        )
    # C1 controls too (U+0080-U+009F): a header's bytes are read as Latin-1, so 0x85 is NEL.
    if any(ord(c) < 32 or 127 <= ord(c) <= 159 for c in value):
        raise BadRequest(f"{HEADER}: must not hold control characters", data={"field": HEADER})
    return value


def body_hash(*, endpoint: str, body: bytes) -> str:
    """What a repeat must match: the endpoint (the agent, for a turn) and the raw body."""
    return hashlib.sha256(endpoint.encode() + b"\0" + body).hexdigest()


def answer_kept(*, completed: bool, provider_status: int | None) -> bool:
    """Whether an answer is recorded for a replay: a completed call's, or the provider's refusal
    of the request itself (a 4xx other than 408, 409, 429), which the same body would get again.
    Anything else (no call, a transient failure, a cut) releases the key: a retry calls again."""
    if completed:
        return True
    if provider_status is None or provider_status in TRANSIENT:
        return False
    return 400 <= provider_status < 500


@dataclass(frozen=True)
class Claim:
    """``new``: this request is the first and makes the call (``row_id`` to complete or
    release); ``replay``: ``row`` holds the answer to give."""

    kind: Literal["new", "replay"]
    row_id: int
    row: IdempotencyKey | None = None


def idempotency_key_claim(
    *, token_id: int, key: str, endpoint: str, digest: str, agent: str, now: datetime
) -> Claim:
    """Claim ``key`` for this request, or find the earlier one's answer. Raises Conflict (409)
    while the first is in flight or when its answer could not be recorded, Unprocessable (422)
    for another body under the key. A key older than the TTL is replaced (the sweep may not
    have run yet); one in flight longer than the in-flight bound (its process died: settings.py
    says when that bound is not past the time a live request takes) is replaced the same way."""
    expired_before = now - timedelta(seconds=settings.AGENTOPS_IDEMPOTENCY_TTL_S)
    abandoned_before = now - timedelta(seconds=settings.AGENTOPS_IDEMPOTENCY_INFLIGHT_S)
    for _ in range(2):
        try:
            with transaction.atomic():
                row = IdempotencyKey.objects.create(
                    token_id=token_id,
                    key=key,
                    body_hash=digest,
                    endpoint=endpoint,
                    agent=agent[:100],
                    created_at=now,
                )
            return Claim("new", row.pk)
        except IntegrityError:
            pass
        found = IdempotencyKey.objects.filter(token_id=token_id, key=key).first()
        if found is None:
            continue  # released or swept meanwhile: claim it again
        abandoned = (
            found.body_hash == digest
            and found.status == IdempotencyKey.Status.IN_FLIGHT
            and found.created_at < abandoned_before
        )
        if found.created_at < expired_before or abandoned:
            # Replaced by a row of its own, so a process that was only slow finds its claim
            # gone (its release or answer matches no row) rather than the new one. Conditional,
            # so of two requests replacing it only one deletes; the other's insert then meets
            # the winner's row, in flight.
            IdempotencyKey.objects.filter(
                pk=found.pk, created_at=found.created_at, status=found.status
            ).delete()
            continue
        return _answer_to_repeat(found, digest=digest)
    raise Conflict(
        f"{HEADER}: another request under this key is being claimed; try again",
        data={"field": HEADER},
    )


def _answer_to_repeat(found: IdempotencyKey, *, digest: str) -> Claim:
    if found.body_hash != digest:
        raise Unprocessable(
            f"{HEADER}: this key was used with a different request (endpoint or body) within "
            f"{settings.AGENTOPS_IDEMPOTENCY_TTL_S:g} s; use a new key for a new request",
            data={"field": HEADER},
        )
    if found.status == IdempotencyKey.Status.IN_FLIGHT:
        raise Conflict(
            f"{HEADER}: a request with this key is still in flight; try again once it is "
            "answered (a request left in flight by a process that stopped is called again after "
            f"AGENTOPS_IDEMPOTENCY_INFLIGHT_MS, {settings.AGENTOPS_IDEMPOTENCY_INFLIGHT_S:g} s)",
            data={"field": HEADER, "in_flight": True},
        )
    if found.status == IdempotencyKey.Status.UNREPLAYABLE:
        raise Conflict(
            f"{HEADER}: the request with this key was answered, but its answer was larger than "
            f"AGENTOPS_IDEMPOTENCY_RECORD_BYTES ({settings.AGENTOPS_IDEMPOTENCY_RECORD_BYTES}) "
            "and was not kept; it is not called again: use a new key to call again",
            data={"field": HEADER, "replayable": False},
        )
    return Claim("replay", found.pk, found)


def idempotency_key_answer(
    *,
    row_id: int,
    status: int,
    headers: dict[str, str],
    body: bytes | None,
    streamed: bool = False,
    turn_id: int | None = None,
    now: datetime | None = None,
) -> None:
    """Record the answer a repeat will be given; ``body`` None: it was too large to keep."""
    IdempotencyKey.objects.filter(pk=row_id).update(
        status=IdempotencyKey.Status.DONE
        if body is not None
        else IdempotencyKey.Status.UNREPLAYABLE,
        answered_at=now or timezone.now(),
        response_status=status,
        response_headers=headers,
        response_body=body,
        streamed=streamed,
        turn_id=turn_id,
    )


def idempotency_key_release(*, row_id: int) -> None:
    """Forget a claim whose request made no provider call or received no answer (refused before
    the call, a transient failure, the client gone): a retry under the key calls again."""
    IdempotencyKey.objects.filter(pk=row_id, status=IdempotencyKey.Status.IN_FLIGHT).delete()


def idempotency_keys_sweep(*, now: datetime) -> int:
    """Delete the keys older than the TTL; returns how many."""
    expired_before = now - timedelta(seconds=settings.AGENTOPS_IDEMPOTENCY_TTL_S)
    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=expired_before).delete()
    return deleted
