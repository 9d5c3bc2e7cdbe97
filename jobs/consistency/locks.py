"""Redis locks with owner tokens, renewal, fencing and a bounded wait.

    with redis_lock(f"report:{day}", ttl=60, wait=10) as lock:
        build_report(day)
        lock.check()                     # raises LockLost if the lock slipped away
        lock.fenced_set("report:latest", day)

- Acquire is one round trip: ``SET key token NX PX ttl`` and ``INCR`` of the
  lock's fencing counter in one Lua script, so every holder gets a larger
  ``lock.fencing_token`` than any holder before it (a large number: counters
  start from Redis's clock in microseconds, so one that expired after a week
  unused starts again above its old tokens). The key holds
  ``<token>@<acquired at, ms>``, so the watchdog sees how long a lock has been
  held however often it was renewed.
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

    Report.objects.filter(pk=pk, fence__lte=lock.fencing_token).update(
        body=body, fence=lock.fencing_token
    )
"""

from __future__ import annotations

import heapq
import itertools
import logging
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import wraps
from typing import Any, ParamSpec, TypeVar

from django.conf import settings
from django_redis import get_redis_connection
from dramatiq.middleware import CurrentMessage
from redis import Redis
from redis.exceptions import RedisError

from jobs.broker.scripts import LuaScript
from jobs.errors import TransientJobError
from jobs.observability import metrics

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

KEY_PREFIX = "lock:"
# How long a fence counter outlives the last acquisition of its lock: far longer
# than any lock TTL and any plausible clock step (see _ACQUIRE).
FENCE_TTL_MS = 7 * 24 * 3600 * 1000

# KEYS: lock key, fence counter. ARGV: token, ttl ms, fence counter ttl ms.
# Returns {fencing token, acquired at} or 0. The stored value is "<token>@<acquired
# at>" (Redis clock, ms): renewals keep it, so the watchdog can tell how long a lock
# has been held, whatever its TTL, with no extra key or round trip.
# The fence counter expires (one per lock name would otherwise pile up forever, one
# a day for the daily report's). A new or expired counter starts at Redis's clock in
# microseconds, so it is still above every token it gave before: those were at most
# its own start plus one per acquisition, and a lock cannot be taken more than once
# a microsecond. Its TTL (FENCE_TTL_MS, counted from the last acquisition) is the
# margin for Redis's clock stepping back.
_ACQUIRE = LuaScript("""
local now = redis.call('time')
local since = now[1] .. string.format('%03d', math.floor(now[2] / 1000))
if not redis.call('set', KEYS[1], ARGV[1] .. '@' .. since, 'NX', 'PX', ARGV[2]) then
  return 0
end
local fence = redis.call('incr', KEYS[2])
if fence == 1 then
  local seed = now[1] .. string.format('%06d', now[2])
  redis.call('set', KEYS[2], seed)
  fence = tonumber(seed)
end
redis.call('pexpire', KEYS[2], ARGV[3])
return {fence, since}
""")
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
local last = tonumber(redis.call('get', KEYS[2]) or '-1')
if tonumber(ARGV[2]) < last then
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


class LockStats:
    """In-process counters for metrics: acquisitions, waits, timeouts, held, lost."""

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

    def add(self, **deltas: float) -> None:
        with self._mutex:
            for name, delta in deltas.items():
                setattr(self._values, name, getattr(self._values, name) + delta)
        if "timeouts" in deltas:
            metrics.LOCK_TIMEOUTS.inc(deltas["timeouts"])
        if "lost" in deltas:
            metrics.LOCKS_LOST.inc(deltas["lost"])

    def acquired(self, waited: float) -> None:
        values = self._values
        metrics.LOCK_WAIT.observe(waited)
        metrics.LOCKS_HELD.inc()
        with self._mutex:
            values.acquired += 1
            values.held += 1
            if waited:
                values.waited += 1
                values.wait_seconds += waited

    def released(self) -> None:
        metrics.LOCKS_HELD.dec()
        with self._mutex:
            self._values.held -= 1

    def snapshot(self) -> dict[str, float]:
        with self._mutex:
            return asdict(self._values)


stats = LockStats()


@dataclass(eq=False)
class RedisLock:
    """A held lock. ``waited`` is the seconds spent waiting to acquire it."""

    name: str
    token: str
    ttl_ms: int
    fencing_token: int
    waited: float
    client: Redis
    renew: bool
    # A lower bound of when Redis may drop the key: TTL counted from before the
    # last SET/PEXPIRE was sent. check() treats the lock as lost past it.
    valid_until: float = 0.0
    _lost: bool = field(default=False, repr=False)  # set by the watchdog thread

    @property
    def key(self) -> str:
        return KEY_PREFIX + self.name

    @property
    def lost(self) -> bool:
        return self._lost or time.monotonic() >= self.valid_until

    def check(self) -> None:
        """Raise ``LockLost`` if the lock may no longer be ours."""
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
    return bool(_FENCED_SET(client, [key, f"{key}:fence"], [value, fencing_token]))


class _Watchdog:
    """One daemon thread per process renewing every held lock at ~1/3 of its TTL."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, RedisLock]] = []
        self._active: set[RedisLock] = set()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, lock: RedisLock) -> None:
        with self._cond:
            self._active.add(lock)
            earliest = self._heap[0][0] if self._heap else None
            due = self._push(lock)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lock-watchdog", daemon=True)
                self._thread.start()
            # Wake the thread only if it sleeps past this lock's renewal: waking
            # it on every acquire costs the holder a GIL hand-off.
            if earliest is None or due < earliest:
                self._cond.notify()

    def unwatch(self, lock: RedisLock) -> None:
        with self._cond:
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
        with self._cond:
            if lock not in self._active:
                return  # the block ended while we renewed: nothing was lost
            if still_ours:
                self._push(lock)
                return
            self._active.discard(lock)
        lock._mark_lost()


_watchdog = _Watchdog()


def _wait_warning_seconds() -> float:
    return float(getattr(settings, "JOBS_LOCK_WAIT_WARNING_MS", 1000)) / 1000


def _acquire(
    client: Redis, name: str, token: str, ttl_ms: int, wait: float
) -> tuple[str, int, float, float]:
    """Return (stored value, fencing token, seconds waited, monotonic time before the SET)."""
    started = attempt = time.monotonic()
    deadline = started + wait
    keys = [KEY_PREFIX + name, f"{KEY_PREFIX}{name}:fence"]
    pause = 0.001
    while True:
        acquired = _ACQUIRE(client, keys, [token, ttl_ms, max(FENCE_TTL_MS, 10 * ttl_ms)])
        if acquired:
            fence, since = acquired
            return f"{token}@{since.decode()}", int(fence), attempt - started, attempt
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


@contextmanager
def redis_lock(
    name: str,
    *,
    ttl: float = 60,
    wait: float = 10,
    renew: bool = True,
    client: Redis | None = None,
) -> Iterator[RedisLock]:
    """Hold the Redis lock ``name`` for the block; ``ttl`` and ``wait`` in seconds."""
    client = client if client is not None else get_redis_connection("default")
    ttl_ms = max(1, int(ttl * 1000))
    # The owner token is what the key holds: the random part and the acquisition time.
    token, fence, waited, sent_at = _acquire(client, name, secrets.token_hex(16), ttl_ms, wait)
    lock = RedisLock(name, token, ttl_ms, fence, waited, client, renew, sent_at + ttl_ms / 1000)
    stats.acquired(waited)
    _log_wait(name, waited)
    if renew:
        _watchdog.watch(lock)
    failed = True
    try:
        yield lock
        failed = False
    finally:
        if renew:
            _watchdog.unwatch(lock)
        stats.released()
        released = _release(lock)
        if not released and not failed:
            raise LockLost(f"lock {name!r} was lost before the block finished")


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
