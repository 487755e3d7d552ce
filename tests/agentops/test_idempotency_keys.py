"""The claim of an ``Idempotency-Key`` (``agentops.idempotency``, architecture.md §14.2) against
the row an earlier request left: in flight, abandoned, answered, too large to record or expired;
and the sweep, which deletes only the expired. The endpoints' own behaviour, through the SDKs
and a real server, is in tests/interfaces/dropin/test_idempotency.py and
tests/interfaces/api/test_idempotency_complete.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from agentops.exceptions import Conflict, Unprocessable
from agentops.idempotency import Claim, idempotency_key_claim, idempotency_keys_sweep
from agentops.models import IdempotencyKey
from tests.factories import IdempotencyKeyFactory

pytestmark = pytest.mark.django_db


def claim_again(earlier: IdempotencyKey, **changed: Any) -> Claim:
    """A repeat of ``earlier``'s request (the same token, key, endpoint and body), now."""
    request = {
        "token_id": earlier.token_id,
        "key": earlier.key,
        "endpoint": earlier.endpoint,
        "digest": earlier.body_hash,
        "agent": earlier.agent,
        **changed,
    }
    return idempotency_key_claim(now=timezone.now(), **request)


def test_a_repeat_while_the_first_is_in_flight_is_a_409_saying_so() -> None:
    earlier = IdempotencyKeyFactory.create()
    with pytest.raises(Conflict) as refused:
        claim_again(earlier)
    assert refused.value.data == {"field": "Idempotency-Key", "in_flight": True}
    assert list(IdempotencyKey.objects.all()) == [earlier]  # the first's claim stands


def test_a_repeat_of_an_answered_request_replays_the_recorded_answer() -> None:
    earlier = IdempotencyKeyFactory.create(done=True)
    claim = claim_again(earlier)
    assert (claim.kind, claim.row_id) == ("replay", earlier.pk)
    assert claim.row is not None and claim.row.response_body is not None
    assert bytes(claim.row.response_body) == earlier.response_body


def test_another_body_under_an_answered_key_is_a_422_and_replays_nothing() -> None:
    earlier = IdempotencyKeyFactory.create(done=True)
    other = IdempotencyKeyFactory.build(body=b'{"messages": []}').body_hash
    with pytest.raises(Unprocessable):
        claim_again(earlier, digest=other)


def test_a_repeat_of_an_answer_too_large_to_record_is_a_409_never_a_new_call() -> None:
    earlier = IdempotencyKeyFactory.create(unreplayable=True)
    with pytest.raises(Conflict) as refused:
        claim_again(earlier)
    assert refused.value.data == {"field": "Idempotency-Key", "replayable": False}


def test_a_key_abandoned_in_flight_is_claimed_anew_by_a_row_of_its_own() -> None:
    earlier = IdempotencyKeyFactory.create(abandoned=True)
    claim = claim_again(earlier)
    assert claim.kind == "new" and claim.row_id != earlier.pk
    assert list(IdempotencyKey.objects.values_list("pk", "status")) == [
        (claim.row_id, IdempotencyKey.Status.IN_FLIGHT)
    ]


def test_an_abandoned_key_with_another_body_is_still_a_422() -> None:
    earlier = IdempotencyKeyFactory.create(abandoned=True)
    other = IdempotencyKeyFactory.build(body=b'{"messages": []}').body_hash
    with pytest.raises(Unprocessable):
        claim_again(earlier, digest=other)
    assert list(IdempotencyKey.objects.all()) == [earlier]


def test_an_expired_key_is_a_new_request_even_when_its_answer_was_recorded() -> None:
    earlier = IdempotencyKeyFactory.create(done=True, expired=True)
    claim = claim_again(earlier)
    assert claim.kind == "new" and claim.row_id != earlier.pk


def test_the_sweep_deletes_the_expired_keys_and_only_them() -> None:
    kept = [
        IdempotencyKeyFactory.create(),
        IdempotencyKeyFactory.create(done=True),
        IdempotencyKeyFactory.create(abandoned=True),
    ]
    IdempotencyKeyFactory.create(expired=True)
    IdempotencyKeyFactory.create(expired=True, done=True)
    assert idempotency_keys_sweep(now=timezone.now()) == 2
    assert set(IdempotencyKey.objects.all()) == set(kept)
