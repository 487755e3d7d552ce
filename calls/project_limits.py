"""Project limits enforced on every call (architecture.md §6.14), shared by every process
through Redis: ``ProjectLimiter``, a part of the runtime that ``ProviderCall.paced`` asks
before the provider's own pacing.

Requests per minute are a moving window and tokens per minute a sliding window counter, both
the ``limits`` library's on its Redis storage: exact for requests (the window holds each
request's instant), a weighted two-window count for tokens (a count per window, whatever the
limit). Calls at once are a sorted set of slots, each scored by when it lapses: released when
the call ends, renewed while it runs, and gone ``SLOT_TTL_MS`` after a process died holding it.

A project's limits are read from its row at most once per ``KNOWN_S`` per process, so a
project without limits costs a dictionary lookup per call, and a change binds everywhere
within a second. Redis unreachable: calls go unlimited (logged once), as unpaced calls do.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Final

import redis
from django.conf import settings
from django.db import DatabaseError
from limits import RateLimitItem, RateLimitItemPerSecond
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter, SlidingWindowCounterRateLimiter

from agentops.alerts import alert_raise
from agentops.models import Project
from agentops.project_limits import LIMIT_MAXIMA, ProjectLimits

logger = logging.getLogger(__name__)

# A project's limits are read again from its row at most this often, per process.
KNOWN_S: Final = 1.0
# A slot of ``concurrent_calls`` lapses this long after it was taken or last renewed (a
# process that died holding it); a call renews its slot every ``SLOT_RENEW_S`` while it runs.
SLOT_TTL_MS: Final = 60_000
SLOT_RENEW_S: Final = 20.0
# A call refused for ``concurrent_calls`` looks again this often while it may wait, and is told
# to come back after ``SLOT_RETRY_MS`` when it may not (no instant says when a call ends).
SLOT_POLL_MS: Final = 100.0
SLOT_RETRY_MS: Final = 1_000.0
PREFIX: Final = "agentops:plimit"

# Returns 1 when a slot was taken, else 0. Lapsed slots (a process died holding them) go first.
_SLOT_TAKE = """
local key, now, ttl = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local limit, slot = tonumber(ARGV[3]), ARGV[4]
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if redis.call('ZCARD', key) >= limit then return 0 end
redis.call('ZADD', key, now + ttl, slot)
redis.call('PEXPIRE', key, ttl)
return 1
"""


@dataclass(frozen=True, slots=True)
class Known:
    """A project's limits as this process last read them. ``identity`` keys its windows: the
    row's id and creation instant, so a project made again under an old id starts afresh."""

    name: str
    identity: str
    limits: ProjectLimits
    read_at: float  # monotonic


@dataclass(frozen=True, slots=True)
class Taken:
    """What a call took from its project's limits, given back or corrected when it ends."""

    project: Known
    slot: str | None
    tokens: int


@dataclass(frozen=True, slots=True)
class Refusal:
    """A call its project's ``limit`` (of ``value``) refuses now; ``wait_ms``: when it may
    have room (for ``concurrent_calls``, a guess: no instant says when a call ends)."""

    project: str
    limit: str
    value: int
    wait_ms: float


class ProjectLimiter:
    """This process's way to the project limits (a part of the runtime)."""

    def __init__(self) -> None:
        pool = redis.ConnectionPool.from_url(
            settings.REDIS_URL, socket_timeout=1.0, socket_connect_timeout=1.0
        )
        self._storage = RedisStorage(settings.REDIS_URL, connection_pool=pool, key_prefix=PREFIX)
        self._client = redis.Redis(connection_pool=pool)  # the same connections
        self._moving = MovingWindowRateLimiter(self._storage)
        self._sliding = SlidingWindowCounterRateLimiter(self._storage)
        self._slot_take = self._client.register_script(_SLOT_TAKE)
        # project id -> its limits as read; one entry per project this process calls for.
        self._known: dict[int, Known] = {}
        self._lock = threading.Lock()  # asked from the runtime's database threads
        self._failing = False  # Redis did not answer: logged once per episode

    async def stop(self) -> None:
        self._client.close()

    def unlimited(self, project_id: int) -> bool:
        """Whether the project is known, as read within ``KNOWN_S``, to have no limits. Cheap:
        asked on the event loop before every call, so such a call costs no hop."""
        known = self._known.get(project_id)
        return (
            known is not None
            and not known.limits.any
            and time.monotonic() - known.read_at < KNOWN_S
        )

    def project(self, project_id: int) -> Known:
        """In a thread: the project's limits, read from its row when not read within
        ``KNOWN_S`` (a project gone since reads as unlimited)."""
        now = time.monotonic()
        known = self._known.get(project_id)
        if known is not None and now - known.read_at < KNOWN_S:
            return known
        row = (
            Project.objects.filter(pk=project_id)
            .values_list("name", "created_at", *LIMIT_MAXIMA)
            .first()
        )
        if row is None:
            known = Known("", str(project_id), ProjectLimits(), now)
        else:
            name, created, rpm, tpm, concurrent = row
            identity = f"{project_id}.{int(created.timestamp() * 1000)}"
            known = Known(name, identity, ProjectLimits(rpm, tpm, concurrent), now)
        with self._lock:
            self._known[project_id] = known
        return known

    def take(self, *, project_id: int, tokens: int, now_ms: float) -> Taken | Refusal | None:
        """In a thread: a call of ``tokens`` (its estimate) taken from its project's limits, or
        the limit that refuses it now (nothing taken), or None: the project has no limits.
        A slot is taken first, then tokens, then the request, each given back when a later
        one refuses: only the request, the scarcest, cannot be given back."""
        known = self.project(project_id)
        limits = known.limits
        if not limits.any:
            return None
        taken = Taken(known, None, 0)
        try:
            if limits.concurrent_calls is not None:
                slot = uuid.uuid4().hex
                args: list[str | int] = [int(now_ms), SLOT_TTL_MS, limits.concurrent_calls, slot]
                if not self._slot_take(keys=[self._slot_key(known)], args=args):
                    return self._refused(known, "concurrent_calls", SLOT_RETRY_MS)
                taken = Taken(known, slot, 0)
            if limits.tokens_per_minute is not None:
                # A call larger than the whole window's tokens goes when the window is empty.
                cost = max(0, min(tokens, limits.tokens_per_minute))
                item = _window_item(limits.tokens_per_minute)
                if cost and not self._sliding.hit(item, known.identity, "tokens", cost=cost):
                    self.release(taken)
                    stats = self._sliding.get_window_stats(item, known.identity, "tokens")
                    # The counter's reset is a weighted guess: never sooner than a poll.
                    wait = max(SLOT_POLL_MS, _ms_until(stats.reset_time))
                    return self._refused(known, "tokens_per_minute", wait)
                taken = Taken(known, taken.slot, cost)
            if limits.requests_per_minute is not None:
                item = _window_item(limits.requests_per_minute)
                if not self._moving.hit(item, known.identity, "requests"):
                    self.release(taken)
                    self.tokens_used(taken, 0)
                    stats = self._moving.get_window_stats(item, known.identity, "requests")
                    return self._refused(known, "requests_per_minute", _ms_until(stats.reset_time))
        except (redis.RedisError, OSError) as exc:
            self._unreachable(exc)
            return None  # unlimited while Redis does not answer, as unpaced calls are
        self._failing = False
        return taken

    def renew(self, taken: Taken) -> None:
        """In a thread, while the call runs: its slot lapses ``SLOT_TTL_MS`` from now."""
        if taken.slot is None:
            return
        key = self._slot_key(taken.project)
        try:
            self._client.zadd(key, {taken.slot: time.time() * 1000 + SLOT_TTL_MS}, xx=True)
            self._client.pexpire(key, SLOT_TTL_MS)
        except (redis.RedisError, OSError) as exc:
            self._unreachable(exc)

    def release(self, taken: Taken) -> None:
        """In a thread, once the call ended (or was never sent): its slot given back."""
        if taken.slot is None:
            return
        try:
            self._client.zrem(self._slot_key(taken.project), taken.slot)
        except (redis.RedisError, OSError) as exc:
            self._unreachable(exc)

    def tokens_used(self, taken: Taken, used: int) -> None:
        """In a thread, once the call ended: its estimate corrected by what the provider said
        it used (0: nothing was sent). Less is given back, more is added. A give-back after
        the window turned lands in the new window (a sliding window counter keeps counts,
        not calls): the error is one call's overestimate, in the limit's favour."""
        limit = taken.project.limits.tokens_per_minute
        if limit is None or used == taken.tokens:
            return
        item = _window_item(limit)
        try:
            if used < taken.tokens:
                # The library's hit with a negative cost: the count goes down, never refused.
                self._storage.acquire_sliding_window_entry(
                    item.key_for(taken.project.identity, "tokens"),
                    item.amount,
                    item.get_expiry(),
                    used - taken.tokens,
                )
            else:
                extra = min(used - taken.tokens, limit)
                self._sliding.hit(item, taken.project.identity, "tokens", cost=extra)
        except (redis.RedisError, OSError) as exc:
            self._unreachable(exc)

    def _refused(self, known: Known, limit: str, wait_ms: float) -> Refusal:
        value = getattr(known.limits, limit)
        refusal = Refusal(known.name, limit, value, max(1.0, wait_ms))
        if self._episode_began(known, limit):
            _alert(refusal)
        return refusal

    def _episode_began(self, known: Known, limit: str) -> bool:
        """Whether this refusal begins an episode of the limit refusing calls (in any process):
        it ends once a whole window passed without a refusal."""
        key = f"{PREFIX}:alerted:{known.identity}:{limit}"
        window_ms = settings.AGENTOPS_PROJECT_LIMIT_WINDOW_S * 1000
        if self._client.set(key, "1", nx=True, px=window_ms):
            return True
        self._client.pexpire(key, window_ms)
        return False

    @staticmethod
    def _slot_key(known: Known) -> str:
        return f"{PREFIX}:slots:{known.identity}"

    def _unreachable(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            logger.warning(
                "project limits: Redis did not answer (%s: %s); calls go unlimited until it does",
                type(exc).__name__,
                str(exc)[:200],
            )


def _window_item(amount: int) -> RateLimitItem:
    return RateLimitItemPerSecond(amount, settings.AGENTOPS_PROJECT_LIMIT_WINDOW_S)


def _ms_until(instant_s: float) -> float:
    return math.ceil(max(0.0, instant_s * 1000 - time.time() * 1000))


def refusal_words(refusal: Refusal) -> str:
    """The refusal for people: which limit of which project, and when it may have room."""
    what = {
        "requests_per_minute": "requests per minute",
        "tokens_per_minute": "tokens per minute",
        "concurrent_calls": "calls at once",
    }[refusal.limit]
    return (
        f"project limit {refusal.limit}: project {refusal.project!r} allows {refusal.value} "
        f"{what}; no call was made; room in about {math.ceil(refusal.wait_ms)} ms"
    )


def _alert(refusal: Refusal) -> None:
    message = (
        f"Project {refusal.project}'s limit {refusal.limit} ({refusal.value}) is refusing its "
        "agents' calls: drop-in requests and /complete are answered 429 without a provider call, "
        "turns are held until the window allows. Raise or lift it with PUT or DELETE "
        f"/api/v1/projects/{refusal.project}/limits, or the admin's project page."
    )
    try:
        alert_raise(
            kind="project-limit",
            agent="*",
            message=message,
            data={
                "project": refusal.project,
                "limit": refusal.limit,
                "value": refusal.value,
                "wait_ms": refusal.wait_ms,
            },
        )
    except DatabaseError:  # the refusal counts more than its alert
        logger.exception("could not store the project-limit alert: %s", message)
