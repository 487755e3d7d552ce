"""Pacing before the 429 (architecture.md §6.13): what a provider's remaining-quota headers
said is left for a (provider, model), shared by every process through Redis.

Every call asks ``Pacer.acquire`` first: while requests remain (or tokens for its estimate),
one is taken and the call goes; when none remain it waits until the provider said they come
back. Every answer, successful or not, tells ``Pacer.note`` what the provider now says is
left. Nothing is known at first: ``PROBES`` calls at most go to learn it (each ``PROBE_MS`` at
most), and the first answer's remaining count is taken less the other probes sent while
nothing was known (a place lapsed under a slow answer lets another go, and it is counted too)
that the provider had not counted before it: with the limit said, those it had counted are the
limit less this call less what is left (a fresh window: calls of the account from elsewhere in
it make that count too high, and one request too many may go, as before any pacing). A provider that sends no such headers is not paced at all (remembered ``PLAIN_MS``).

Why Redis and not the journal: this is short-lived state read before every call by every
process, stale within seconds, and losing it costs at most one 429, which is then journaled
as any other (§6.12). The counters are updated by two Lua scripts so that concurrent callers
in any process never take the same request twice. The ``limits`` library keeps limits an
application sets for itself; these are the provider's own numbers, set from its headers, so
the two scripts are ours.
"""

from __future__ import annotations

import logging
import time
from typing import Final

import redis
from django.conf import settings

from agentops.memory import Recent
from calls.limits import Quota

logger = logging.getLogger(__name__)

# While a (provider, model)'s quota is not known, this many calls at most go to learn it, each
# holding its place until its answer's head arrives or this long has passed.
PROBES: Final = 2
PROBE_MS: Final = 1_000
# How long a (provider, model) whose answers carry no quota headers goes unpaced before its
# next answer is looked at again.
PLAIN_MS: Final = 300_000
# A stated reset this close to the one kept is the same window (OpenAI's are whole seconds),
# or a quarter of the window when that is shorter.
SAME_WINDOW_MS: Final = 1_000
# No request is taken this close to its window's end: sent then, it may reach the provider in
# the next window and be counted there too.
GUARD_MS: Final = 100
# Kept this long past its latest reset: the limit is still known when the next burst comes.
KEEP_MS: Final = 120_000
# While another call learns the quota, or no reset is known, look again this often.
POLL_MS: Final = 50.0

# Returns 0 (go), or the ms to wait (-1: nobody knows yet; look again shortly).
_ACQUIRE = """
local key, probe = KEYS[1], KEYS[2]
local now, need, probe_ms = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local guard = tonumber(ARGV[4])
local s = redis.call('HMGET', key, 'none', 'rl', 'rr', 'rt', 'rw', 'tl', 'tr', 'tt', 'tw')
if s[1] then return 0 end
local rl, rr, rt, rw = tonumber(s[2]), tonumber(s[3]), tonumber(s[4]), tonumber(s[5])
local tl, tr, tt, tw = tonumber(s[6]), tonumber(s[7]), tonumber(s[8]), tonumber(s[9])
if rr == nil and tr == nil then
  for i = 1, tonumber(ARGV[5]) do
    if redis.call('SET', probe .. ':' .. i, '1', 'NX', 'PX', probe_ms) then
      -- Counted apart from the places, which lapse while a slow answer is still out.
      redis.call('HINCRBY', key, 'probes', 1)
      redis.call('PEXPIRE', key, tonumber(ARGV[6]))
      return 0
    end
  end
  return -1
end
local function roll(limit, left, reset, window)
  if left ~= nil and reset ~= nil and now >= reset then
    left = limit
    if window ~= nil and window > 0 then
      reset = reset + math.ceil((now - reset + 1) / window) * window
    else
      reset = nil
    end
  end
  return left, reset
end
rr, rt = roll(rl, rr, rt, rw)
tr, tt = roll(tl, tr, tt, tw)
-- A call taken this close to its window's end may reach the provider in the next one.
if rr ~= nil and rt ~= nil and rt - now < guard then return math.max(1, rt - now) end
if rr ~= nil and rr <= 0 then
  if rt ~= nil then return math.max(1, rt - now) end
  return -1
end
if tr ~= nil and need > 0 and tr < need and (tl == nil or need <= tl) then
  if tt ~= nil then return math.max(1, tt - now) end
  return -1
end
if rr ~= nil then redis.call('HSET', key, 'rr', rr - 1) end
if rt ~= nil then redis.call('HSET', key, 'rt', rt) else redis.call('HDEL', key, 'rt') end
if tr ~= nil then redis.call('HSET', key, 'tr', math.max(0, tr - need)) end
if tt ~= nil then redis.call('HSET', key, 'tt', tt) else redis.call('HDEL', key, 'tt') end
return 0
"""

# ARGV: now, then limit/remaining/reset for requests and for tokens ('' when not said).
_NOTE = """
local key, probe = KEYS[1], KEYS[2]
local now, same, keep = tonumber(ARGV[1]), tonumber(ARGV[8]), tonumber(ARGV[9])
local function note(l, r, t, fl, fr, ft, fw)
  local limit, left, reset = tonumber(l), tonumber(r), tonumber(t)
  if left == nil then return end
  if limit ~= nil then redis.call('HSET', key, fl, limit) end
  local kept = tonumber(redis.call('HGET', key, ft))
  local width = tonumber(redis.call('HGET', key, fw)) or 0
  local tol = same
  if width > 0 and width / 4 < tol then tol = width / 4 end
  if reset == nil then
    redis.call('HSET', key, fr, left)
  elseif kept == nil or reset > kept + tol then
    redis.call('HSET', key, fr, left, ft, reset)
    local window = tonumber(redis.call('HGET', key, fw)) or 0
    if reset - now > window then redis.call('HSET', key, fw, reset - now) end
  elseif reset >= kept - tol then
    local mine = tonumber(redis.call('HGET', key, fr))
    if mine == nil or left < mine then redis.call('HSET', key, fr, left) end
    if reset > kept then redis.call('HSET', key, ft, reset) end
  end
end
-- The first answer's count leaves out the other probes sent while nothing was known that the
-- provider had not counted before it: with the limit said, those it had are the limit less this
-- call less what is left.
local left = ARGV[3]
if left ~= '' and redis.call('HEXISTS', key, 'rr') == 0 and redis.call('HEXISTS', key, 'tr') == 0 then
  local out = (tonumber(redis.call('HGET', key, 'probes')) or 1) - 1
  local limit = tonumber(ARGV[2])
  if limit ~= nil then out = out - math.max(0, limit - 1 - tonumber(left)) end
  if out > 0 then left = math.max(0, tonumber(left) - out) end
end
redis.call('HDEL', key, 'none', 'probes')
note(ARGV[2], left, ARGV[4], 'rl', 'rr', 'rt', 'rw')
note(ARGV[5], ARGV[6], ARGV[7], 'tl', 'tr', 'tt', 'tw')
local last = math.max(tonumber(redis.call('HGET', key, 'rt')) or now,
                      tonumber(redis.call('HGET', key, 'tt')) or now)
redis.call('PEXPIRE', key, math.ceil(last - now + keep))
for i = 1, tonumber(ARGV[10]) do redis.call('DEL', probe .. ':' .. i) end
return 0
"""


def _key(provider: str, model: str) -> tuple[str, str]:
    base = f"agentops:pace:{len(provider)}:{provider}:{model}"
    return base, base + ":probe"


def _arg(value: float | None) -> str:
    return "" if value is None else str(int(value))


class Pacer:
    """This process's way to the shared pacing state (a part of the runtime). It remembers,
    for ``PLAIN_MS``, which (provider, model)s send no quota headers, so those cost no
    round trip to Redis; and, for the routing choice, each pooled agent's place in its
    members' rotation (``rotations``, ``turns.serving.serving_choose``): each process spreads
    its own calls by weight, so all of them together do to within a call each. A rotation is
    forgotten after an idle hour (it starts again even), bounded by the agents in use."""

    def __init__(self) -> None:
        self._client = redis.Redis.from_url(
            settings.REDIS_URL,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
            decode_responses=True,
        )
        self._acquire = self._client.register_script(_ACQUIRE)
        self._note = self._client.register_script(_NOTE)
        # (provider, model) -> monotonic instant until which its answers are taken to carry
        # no quota headers. One entry per target a process calls: bounded by the providers.
        self._plain: dict[tuple[str, str], float] = {}
        self._failing = False  # Redis did not answer: logged once per episode
        self.rotations: Recent[int, dict[tuple[int, str], float]] = Recent(size=10_000, ttl_s=3600)

    async def stop(self) -> None:
        self._client.close()

    def plain(self, provider: str, model: str) -> bool:
        """Whether the target is known to send no quota headers (no pacing, no round trip).
        Cheap: called on the event loop before every call."""
        until = self._plain.get((provider, model))
        return until is not None and until > time.monotonic()

    def acquire(self, *, provider: str, model: str, tokens: int, now_ms: float) -> float:
        """In a thread: 0 when the call may go (a request, and ``tokens`` of the estimate,
        taken from what is left), else how many ms to wait before asking again."""
        if self.plain(provider, model):
            return 0.0
        try:
            wait = float(
                self._acquire(
                    keys=_key(provider, model),
                    args=[int(now_ms), tokens, PROBE_MS, GUARD_MS, PROBES, KEEP_MS],
                )
            )
        except (redis.RedisError, OSError) as exc:
            self._unreachable(exc)
            return 0.0  # losing the pacing costs at most a 429, which is journaled as any
        self._failing = False
        return POLL_MS if wait < 0 else wait

    def standing(
        self, targets: list[tuple[str, str]], *, now_ms: float
    ) -> list[tuple[float, float | None]]:
        """In a thread, for each (provider, model): how long a call would wait for its quota
        now (0: it may go) and the share of its requests left (None: not known), without
        taking anything, in one round trip. For choosing among targets (§6.11, §6.15)."""
        asked = [
            i for i, (provider, model) in enumerate(targets) if not self.plain(provider, model)
        ]
        out: list[tuple[float, float | None]] = [(0.0, None)] * len(targets)
        if not asked:
            return out
        try:
            pipe = self._client.pipeline(transaction=False)
            for i in asked:
                pipe.hmget(_key(*targets[i])[0], ["rl", "rr", "rt"])
            found = pipe.execute()
        except (redis.RedisError, OSError) as exc:
            self._unreachable(exc)
            return out
        for i, (limit, left, reset) in zip(asked, found, strict=True):
            if left is None:
                continue
            passed = reset is None or float(reset) <= now_ms
            room = 1.0 if passed else float(left) / float(limit) if limit else None
            wait = 0.0 if passed or float(left) > 0 else float(reset) - now_ms
            out[i] = (wait, room)
        return out

    def note(self, *, provider: str, model: str, quota: Quota | None, now_ms: float) -> None:
        """In a thread, after an answer: what its headers say is left (None: it had none)."""
        key, probe = _key(provider, model)
        try:
            if quota is None:
                if not self.plain(provider, model):
                    self._plain[(provider, model)] = time.monotonic() + PLAIN_MS / 1000
                    pipe = self._client.pipeline()
                    pipe.hset(key, "none", 1)
                    pipe.pexpire(key, PLAIN_MS)
                    pipe.delete(*(f"{probe}:{i}" for i in range(1, PROBES + 1)))
                    pipe.execute()
                return
            self._plain.pop((provider, model), None)
            self._note(
                keys=[key, probe],
                args=[
                    int(now_ms),
                    _arg(quota.requests_limit),
                    _arg(quota.requests_remaining),
                    _arg(quota.requests_reset_ms),
                    _arg(quota.tokens_limit),
                    _arg(quota.tokens_remaining),
                    _arg(quota.tokens_reset_ms),
                    SAME_WINDOW_MS,
                    KEEP_MS,
                    PROBES,
                ],
            )
        except (redis.RedisError, OSError) as exc:
            self._unreachable(exc)

    def limits(self, provider: str) -> list[dict[str, object]]:
        """What is known of each of ``provider``'s models now, for operators."""
        found: list[dict[str, object]] = []
        prefix = f"agentops:pace:{len(provider)}:{provider}:"
        try:
            pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
            for key in self._client.scan_iter(match=pattern, count=200):
                if key.rsplit(":", 2)[-2:-1] == ["probe"]:
                    continue
                state: dict[str, str] = self._client.hgetall(key)  # type: ignore[assignment]
                if "none" in state:
                    continue
                state.pop("probes", None)  # the pacing's own count, not the provider's words
                found.append({"model": key[len(prefix) :], **state})
        except (redis.RedisError, OSError) as exc:
            self._unreachable(exc)
        return found

    def _unreachable(self, exc: BaseException) -> None:
        if not self._failing:
            self._failing = True
            logger.warning(
                "pacing: Redis did not answer (%s: %s); calls go unpaced until it does "
                "(a 429 that follows is recorded as usual)",
                type(exc).__name__,
                str(exc)[:200],
            )
