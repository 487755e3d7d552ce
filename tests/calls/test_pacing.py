"""The pacing scripts on the real Redis (architecture.md §6.13): what a first answer says is
left is shared with the calls that went to learn it alongside."""

from __future__ import annotations

import time
import uuid

import pytest

from calls.limits import Quota
from calls.pacing import PROBES, Pacer
from turns.runtime import TurnRuntime


@pytest.fixture
def pacer(runtime: TurnRuntime) -> Pacer:
    return runtime.pacer


def taken(pacer: Pacer, model: str, now_ms: float) -> int:
    """How many calls may go now, one after another."""
    count = 0
    while pacer.acquire(provider="p", model=model, tokens=0, now_ms=now_ms) == 0:
        count += 1
        assert count < 100, "the quota never ran out"
    return count


def test_a_first_answer_leaves_out_the_other_probe_still_out(pacer: Pacer) -> None:
    """Two probes go at once; the first answer says 3 of 4 are left, counted before the second
    probe reached the provider: 2 more calls go, not 3 (the fifth would be a 429)."""
    model, now_ms = f"m-{uuid.uuid4().hex[:8]}", time.time() * 1000
    assert PROBES == 2
    assert taken(pacer, model, now_ms) == 2  # both probes; a third waits for their answers
    quota = Quota(requests_limit=4, requests_remaining=3, requests_reset_ms=now_ms + 2000)
    pacer.note(provider="p", model=model, quota=quota, now_ms=now_ms)
    assert taken(pacer, model, now_ms) == 2
    # The second probe's answer says 2 are left: no more than what was already taken from.
    quota = Quota(requests_limit=4, requests_remaining=2, requests_reset_ms=now_ms + 2000)
    pacer.note(provider="p", model=model, quota=quota, now_ms=now_ms)
    assert taken(pacer, model, now_ms) == 0


def test_a_lone_probes_answer_is_taken_as_it_is(pacer: Pacer) -> None:
    model, now_ms = f"m-{uuid.uuid4().hex[:8]}", time.time() * 1000
    assert pacer.acquire(provider="p", model=model, tokens=0, now_ms=now_ms) == 0
    quota = Quota(requests_limit=4, requests_remaining=3, requests_reset_ms=now_ms + 2000)
    pacer.note(provider="p", model=model, quota=quota, now_ms=now_ms)
    assert taken(pacer, model, now_ms) == 3


def test_a_probe_sent_after_a_place_lapsed_is_left_out_too(pacer: Pacer) -> None:
    """A slow first answer: its place lapses after PROBE_MS, a third probe goes, and the first
    answer then says 3 of 4 are left: counted before the other two, so 1 more goes, not 3."""
    import redis
    from django.conf import settings

    from calls.pacing import _key

    model, now_ms = f"m-{uuid.uuid4().hex[:8]}", time.time() * 1000
    assert taken(pacer, model, now_ms) == 2
    probe = _key("p", model)[1]
    redis.Redis.from_url(settings.REDIS_URL).delete(f"{probe}:1")  # as PROBE_MS lapsing does
    assert taken(pacer, model, now_ms) == 1  # the lapsed place: a third probe
    quota = Quota(requests_limit=4, requests_remaining=3, requests_reset_ms=now_ms + 2000)
    pacer.note(provider="p", model=model, quota=quota, now_ms=now_ms)
    assert taken(pacer, model, now_ms) == 1
    assert pacer.limits("p")[0].keys() >= {"rl", "rr", "rt"}
    assert "probes" not in pacer.limits("p")[0]


def test_a_first_answer_counted_after_the_other_probe_is_taken_as_it_is(pacer: Pacer) -> None:
    """The answer noted first may be the one the provider counted second: it says 2 of 4 left,
    the other probe already in it; all 2 go (none of the window is left unused)."""
    model, now_ms = f"m-{uuid.uuid4().hex[:8]}", time.time() * 1000
    assert taken(pacer, model, now_ms) == 2
    quota = Quota(requests_limit=4, requests_remaining=2, requests_reset_ms=now_ms + 2000)
    pacer.note(provider="p", model=model, quota=quota, now_ms=now_ms)
    assert taken(pacer, model, now_ms) == 2
