"""Redis locks with owner tokens, renewal, fencing and a bounded wait.

    with redis_lock(f"report:{day}", ttl=60, wait=10) as lock:
        fence = lock.fencing_token       # issued while the lock is surely ours
        build_report(day)
        lock.check()                     # raises LockLost if the lock slipped away
        lock.fenced_set("report:latest", day)

- Acquire is one round trip, a plain ``SET key value NX PX ttl``. The key holds
  ``<token>@<acquired at, ms>`` (the holder's wall clock), so the watchdog sees
  how long a lock has been held however often it was renewed.
- Fencing tokens are issued on first use of ``lock.fencing_token`` (or
  ``lock.fenced_set``), by a Lua script that ``INCR``s the lock's fence counter
  only if the caller still holds the lock. Tokens are therefore given out in
  the order of the holdings they belong to: every holder that asks gets a larger
  token than any holder before it, and a holder asking after its lock slipped
  away (or after its block ended) gets ``LockLost`` instead of a token, so it
  can write nothing fenced. Counters start from Redis's clock in microseconds,
  so one that expired after a week unused starts again above its old tokens.
  Most locks never fence, and an acquire that also incremented a counter cost a
  Lua script per lock (about 10 us, 4% of an uncontended cycle).
- Release is a Lua compare-and-delete on the token: a worker never deletes a lock
  another worker took after its own expired.
- ``renew=True`` (the default) hands the lock to one watchdog thread per process
  that extends the TTL every ``ttl / 3``. The watchdog dies with the process, so
  a crashed holder's lock expires after one TTL.
- A holder learns when its lock is gone: ``lock.check()`` raises ``LockLost`` once
  the watchdog found the token missing or the TTL may have run out, and leaving
  the block raises ``LockLost`` instead of returning as if nothing happened.
- Not acquired within ``wait`` seconds: ``LockNotAcquired``, a transient job
  error, so the Retries middleware retries the job with backoff.

Fencing a database write with the token (a stale holder updates nothing):

    Report.objects.filter(pk=pk, fence__lte=fence).update(body=body, fence=fence)
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import random
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from dramatiq.middleware import CurrentMessage
from redis import Redis
from redis.exceptions import RedisError

from jobs.broker.scripts import LuaScript
from jobs.conf import jobs_settings
from jobs.consistency.connection import default_redis
from jobs.errors import TransientJobError
from jobs.observability import metrics
from jobs.observability.flushing import PeriodicFlush
from jobs.runtime import cancellation

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

KEY_PREFIX = "lock:"
# How long a fence counter outlives the last token it issued: far longer than any
# lock TTL and any plausible clock step (see _ISSUE_FENCE).
FENCE_TTL_MS = 7 * 24 * 3600 * 1000

# KEYS: lock key, fence counter. ARGV: the holder's stored value, fence counter ttl ms.
# Returns the next fencing token, or 0 if the caller no longer holds the lock.
# The fence counter expires (one per lock name would otherwise pile up forever, one
# a day for the daily report's). A new or expired counter starts at Redis's clock in
# microseconds, so it is still above every token it gave before: those were at most
# its own start plus one per issue, and a token cannot be issued more than once a
# microsecond. Its TTL (FENCE_TTL_MS, counted from the last issue) is the margin for
# Redis's clock stepping back.
_ISSUE_FENCE = LuaScript("""
if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
local fence = redis.call('incr', KEYS[2])
if fence == 1 then
  local now = redis.call('time')
  local seed = now[1] .. string.format('%06d', now[2])
  redis.call('set', KEYS[2], seed)
  fence = tonumber(seed)
end
redis.call('pexpire', KEYS[2], ARGV[2])
return fence
""")
_FENCE_MUTEX = threading.Lock()

# KEYS: lock key. ARGV: token. 1 if this token held the lock, else 0.
_RELEASE = LuaScript("""
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
""")
# KEYS: lock key. ARGV: token, ttl ms.
_EXTEND = LuaScript("""
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
""")
# KEYS: data key, its fence key. ARGV: value, fencing token.
# Writes only if no larger token has written before (equal: the same holder again).
_FENCED_SET = LuaScript("""
local last = tonumber(redis.call('get', KEYS[2]) or '0')
if tonumber(ARGV[2]) <= 0 or tonumber(ARGV[2]) < last then
  return 0
end
redis.call('set', KEYS[2], ARGV[2])
redis.call('set', KEYS[1], ARGV[1])
return 1
""")


class LockNotAcquired(TransientJobError):
    """Another holder kept the lock for the whole wait; the job is retried later."""


class LockLost(TransientJobError):
    """The lock expired or was taken while held; work done under it is suspect."""


class LockStats(PeriodicFlush):
    """In-process counters: acquisitions, waits, timeouts, held, lost.

    They reach Prometheus from a daemon thread once a second (and at exit), not
    on each acquire and release: in multiprocess mode every metric write is a
    locked mmap write, and the four of a lock cycle (wait histogram, held gauge
    up and down) were 7% of an uncontended acquire + release on loopback Redis.
    A wait that lasted is observed at once, with its duration; the flusher adds
    the acquisitions that did not wait to the histogram's first bucket.
    """

    flusher_name = "lock-metrics"

    @dataclass
    class Snapshot:
        acquired: int = 0
        waited: int = 0
        wait_seconds: float = 0.0
        timeouts: int = 0
        held: int = 0
        lost: int = 0

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._values = LockStats.Snapshot()
        self._unflushed_no_waits = 0
        self._flushed_held = 0
        # Bumped in a forked child: a lock taken before the fork is not one the
        # child holds, so its release there does not count (see released()).
        self.generation = 0

    def add(self, **deltas: float) -> None:
        with self._mutex:
            for name, delta in deltas.items():
                setattr(self._values, name, getattr(self._values, name) + delta)
        if "timeouts" in deltas:
            metrics.LOCK_TIMEOUTS.inc(deltas["timeouts"])
        if "lost" in deltas:
            metrics.LOCKS_LOST.inc(deltas["lost"])

    def acquired(self, waited: float) -> int:
        """Count an acquisition; returns the generation its release must match."""
        values = self._values
        with self._mutex:
            values.acquired += 1
            values.held += 1
            if waited:
                values.waited += 1
                values.wait_seconds += waited
            else:
                self._unflushed_no_waits += 1
        if waited:
            metrics.LOCK_WAIT.observe(waited)
        self._ensure_flusher()
        return self.generation

    def released(self, generation: int) -> None:
        if generation != self.generation:
            return  # taken by the parent before a fork: never counted here
        with self._mutex:
            self._values.held -= 1

    def snapshot(self) -> dict[str, float]:
        with self._mutex:
            return asdict(self._values)

    def flush(self) -> None:
        """Write what the hot path only counted to this process's metrics."""
        with self._mutex:
            no_waits, self._unflushed_no_waits = self._unflushed_no_waits, 0
            held = self._values.held
        if no_waits:
            # Histogram has no public "observe n times"; observe(0) n times would
            # be n locked writes again. A zero wait belongs in the first bucket
            # and adds 0 to the sum (tests/jobs/observability/test_metrics.py
            # checks the exposed _count and _bucket lines).
            metrics.LOCK_WAIT._buckets[0].inc(no_waits)
        if held != self._flushed_held:
            metrics.LOCKS_HELD.set(held)
            self._flushed_held = held

    def after_fork_in_child(self) -> None:
        """Start from nothing: the parent flushes its own counts, holds its own locks."""
        self._mutex = threading.Lock()  # the parent's may have been held at the fork
        self._values.held = 0
        self._unflushed_no_waits = 0
        self._flushed_held = 0
        self._forget_flusher()
        self.generation += 1


stats = LockStats()
os.register_at_fork(after_in_child=stats.after_fork_in_child)


class RedisLock:
    """A held lock. ``waited`` is the seconds spent waiting to acquire it.

    A plain class with slots, not a dataclass: one is built per acquisition.
    """

    __slots__ = (
        "_fence",
        "_lost",
        "_released",
        "client",
        "name",
        "renew",
        "token",
        "ttl_ms",
        "valid_until",
        "waited",
    )

    def __init__(
        self,
        name: str,
        token: str,
        ttl_ms: int,
        waited: float,
        client: Redis,
        renew: bool,
        valid_until: float = 0.0,
    ) -> None:
        self.name = name
        self.token = token  # what the key holds: "<random>@<acquired at, ms>"
        self.ttl_ms = ttl_ms
        self.waited = waited
        self.client = client
        self.renew = renew
        # A lower bound of when Redis may drop the key: TTL counted from before the
        # last SET/PEXPIRE was sent. check() treats the lock as lost past it.
        self.valid_until = valid_until
        self._lost = False  # set by the watchdog thread
        self._released = False
        self._fence: int | None = None

    def __repr__(self) -> str:
        return f"RedisLock(name={self.name!r}, ttl_ms={self.ttl_ms}, waited={self.waited:.3f})"

    @property
    def fencing_token(self) -> int:
        """This holding's fencing token, issued on first use.

        Raises ``LockLost`` if the lock slipped away (or the block ended) before
        the token was asked for: a token issued then could be larger than the
        next holder's, and 0 would still pass a check against a key or row no
        holder has fenced yet.
        """
        fence = self._fence
        if fence is None:
            # One token per holding, even if two threads of the holder ask at once.
            with _FENCE_MUTEX:
                fence = self._fence
                if fence is None:
                    fence = self._fence = self._issue_fence()
        return fence

    def _issue_fence(self) -> int:
        if self._released:
            raise LockLost(f"lock {self.name!r} was released before its fencing token was issued")
        if self._lost:
            raise LockLost(f"lock {self.name!r} was lost before its fencing token was issued")
        fence_ttl_ms = max(FENCE_TTL_MS, 10 * self.ttl_ms)
        keys = [self.key, self.key + ":fence"]
        fence = int(_ISSUE_FENCE(self.client, keys, [self.token, fence_ttl_ms]))
        if not fence:
            self._mark_lost()
            raise LockLost(f"lock {self.name!r} was lost before its fencing token was issued")
        return fence

    @property
    def key(self) -> str:
        return KEY_PREFIX + self.name

    @property
    def lost(self) -> bool:
        return self._lost or time.monotonic() >= self.valid_until

    def check(self) -> None:
        """Raise ``LockLost`` if the lock may no longer be ours (and ``JobCancelled``
        if the job holding it was cancelled: a natural place to stop)."""
        cancellation.check()
        if self.lost:
            raise LockLost(f"lock {self.name!r} was lost while held")

    def fenced_set(self, key: str, value: str | bytes | int) -> bool:
        """SET ``key`` unless a holder with a larger fencing token wrote it; True if written."""
        return fenced_set(self.client, key, value, self.fencing_token)

    def _extend(self) -> bool:
        started = time.monotonic()
        extended = bool(_EXTEND(self.client, [self.key], [self.token, self.ttl_ms]))
        if extended:
            self.valid_until = started + self.ttl_ms / 1000
        return extended

    def _mark_lost(self) -> None:
        if not self._lost:
            self._lost = True
            stats.add(lost=1)
            logger.warning("Lock %s lost while held (token gone)", self.name)


def held_since_ms(value: bytes | str) -> int | None:
    """When a lock with stored ``value`` was acquired (Redis clock, ms); None if not ours."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    _, at, since = text.rpartition("@")
    return int(since) if at and since.isdigit() else None


def fenced_set(client: Redis, key: str, value: str | bytes | int, fencing_token: int) -> bool:
    """Atomically write ``key`` only if ``fencing_token`` >= the last token that wrote it."""
    if fencing_token <= 0:
        return False  # not a token redis_lock issues
    return bool(_FENCED_SET(client, [key, f"{key}:fence"], [value, fencing_token]))


class _Watchdog:
    """One daemon thread per process renewing every held lock at ~1/3 of its TTL."""

    def __init__(self) -> None:
        self.after_fork_in_child()

    def after_fork_in_child(self) -> None:
        """A fresh, empty watchdog: threads do not survive a fork, held locks stay the parent's."""
        # watch() and unwatch() run on every lock cycle: they take the bare lock
        # (a C call), not the Condition's Python-level __enter__ around it.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._heap: list[tuple[float, int, RedisLock]] = []
        self._active: set[RedisLock] = set()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, lock: RedisLock) -> None:
        with self._mutex:
            self._active.add(lock)
            earliest = self._heap[0][0] if self._heap else None
            due = self._push(lock)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lock-watchdog", daemon=True)
                self._thread.start()
            # Wake the thread only if it sleeps past this lock's renewal: waking
            # it on every acquire costs the holder a GIL hand-off.
            if earliest is None or due < earliest:
                self._cond.notify()

    def unwatch(self, lock: RedisLock) -> None:
        with self._mutex:
            self._active.discard(lock)  # its heap entry is skipped when due

    def _push(self, lock: RedisLock) -> float:
        due = time.monotonic() + lock.ttl_ms / 3000
        heapq.heappush(self._heap, (due, next(self._seq), lock))
        return due

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    timeout = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(timeout)
                _, _, lock = heapq.heappop(self._heap)
                if lock not in self._active:
                    continue
            self._renew(lock)

    def _renew(self, lock: RedisLock) -> None:
        try:
            still_ours = lock._extend()
        except RedisError as exc:
            # Try again next period; if Redis stays away the key expires and the
            # next attempt finds it gone, which marks the lock lost.
            logger.warning("Renewing lock %s failed: %s", lock.name, exc)
            still_ours = True
        except Exception:
            # Anything else must not end the one renewal thread of the process
            # (it is not restarted): log it and try again next period.
            logger.exception("Renewing lock %s failed", lock.name)
            still_ours = True
        with self._cond:
            if lock not in self._active:
                return  # the block ended while we renewed: nothing was lost
            if still_ours:
                self._push(lock)
                return
            self._active.discard(lock)
        lock._mark_lost()


_watchdog = _Watchdog()
os.register_at_fork(after_in_child=_watchdog.after_fork_in_child)


def _wait_warning_seconds() -> float:
    return float(jobs_settings.JOBS_LOCK_WAIT_WARNING_MS) / 1000


def _acquire(
    client: Redis, name: str, token: str, ttl_ms: int, wait: float
) -> tuple[str, float, float]:
    """Return (stored value, seconds waited, monotonic time before the SET)."""
    started = attempt = time.monotonic()
    deadline = started + wait
    key = KEY_PREFIX + name
    pause = 0.001
    while True:
        # The value records when this attempt took the lock, on the holder's wall
        # clock: hosts run NTP, and the watchdog's threshold is minutes.
        value = f"{token}@{time.time_ns() // 1_000_000}"
        if client.set(key, value, nx=True, px=ttl_ms):
            return value, attempt - started, attempt
        cancellation.check()  # a job cancelled while it waits stops waiting
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            stats.add(timeouts=1)
            raise LockNotAcquired(f"lock {name!r} still held by another after {wait:.3g} s")
        # Jittered, growing pause: waiters do not hammer Redis or wake in lock-step.
        time.sleep(min(remaining, pause * random.uniform(0.5, 1.5)))
        pause = min(pause * 2, 0.025)
        attempt = time.monotonic()


def _log_wait(name: str, waited: float) -> None:
    if waited == 0 or waited < _wait_warning_seconds():
        return
    message = CurrentMessage.get_current_message()
    logger.warning(
        "Waited %.3f s for lock %s (message %s)",
        waited,
        name,
        message.message_id if message is not None else "-",
    )


def redis_lock(
    name: str,
    *,
    ttl: float = 60,
    wait: float = 10,
    renew: bool = True,
    client: Redis | None = None,
) -> _LockBlock:
    """Hold the Redis lock ``name`` for the block; ``ttl`` and ``wait`` in seconds."""
    return _LockBlock(name, ttl, wait, renew, client)


class _LockBlock:
    """``with redis_lock(...) as lock``: a class, not a generator context manager,
    because the generator's frame and its send/throw machinery cost a few us per
    cycle on a path whose baseline is two Redis round trips. Like the generator
    it replaces, it is good for one ``with``: entering it again raises, so two
    threads sharing one object cannot release each other's holdings."""

    __slots__ = (
        "_client",
        "_entered",
        "_generation",
        "_lock",
        "_name",
        "_renew",
        "_ttl_ms",
        "_wait",
    )

    def __init__(
        self, name: str, ttl: float, wait: float, renew: bool, client: Redis | None
    ) -> None:
        self._name = name
        self._ttl_ms = max(1, int(ttl * 1000))
        self._wait = wait
        self._renew = renew
        self._client = client
        self._lock: RedisLock | None = None
        self._entered = False
        self._generation = 0

    def __enter__(self) -> RedisLock:
        if self._entered:
            raise RuntimeError("a redis_lock(...) object is good for one with-block; call it again")
        self._entered = True
        client = self._client if self._client is not None else default_redis()
        name, ttl_ms = self._name, self._ttl_ms
        # The owner token is what the key holds: the random part and the acquisition time.
        token, waited, sent_at = _acquire(client, name, secrets.token_hex(16), ttl_ms, self._wait)
        lock = RedisLock(name, token, ttl_ms, waited, client, self._renew, sent_at + ttl_ms / 1000)
        self._lock = lock
        self._generation = stats.acquired(waited)
        if waited:
            _log_wait(name, waited)
        if self._renew:
            _watchdog.watch(lock)
        return lock

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        lock = self._lock
        assert lock is not None, "__exit__ without __enter__"
        if self._renew:
            _watchdog.unwatch(lock)
        stats.released(self._generation)
        released = _release(lock)
        lock._released = True
        if not released and exc_type is None:
            raise LockLost(f"lock {lock.name!r} was lost before the block finished")


def _release(lock: RedisLock) -> bool:
    """Compare-and-delete; False if the lock was no longer ours."""
    try:
        released = bool(_RELEASE(lock.client, [lock.key], [lock.token]))
    except RedisError as exc:
        logger.warning("Releasing lock %s failed (it expires after its TTL): %s", lock.name, exc)
        return not lock.lost
    if not released:
        lock._mark_lost()
    return released and not lock._lost


@dataclass(frozen=True)
class LockDeclaration:
    """What ``holds_lock`` recorded on a function, read by the ``jobs`` system check."""

    name_template: str
    ttl: float
    renew: bool


def holds_lock(
    name_template: str, *, ttl: float = 60, wait: float = 10, renew: bool = True
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Run the function under ``redis_lock(name_template.format(*args, **kwargs))``.

    Put it under ``@dramatiq.actor`` so the system check can compare the actor's
    time limit with the TTL of a lock declared with ``renew=False``.
    """

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            name = name_template.format(*args, **kwargs)
            with redis_lock(name, ttl=ttl, wait=wait, renew=renew):
                return fn(*args, **kwargs)

        declared: list[LockDeclaration] = list(getattr(fn, "lock_declarations", []))
        declared.append(LockDeclaration(name_template, ttl, renew))
        wrapper.lock_declarations = declared  # type: ignore[attr-defined]
        return wrapper

    return decorate


def lock_declarations(fn: Any) -> list[LockDeclaration]:
    return list(getattr(fn, "lock_declarations", []))
