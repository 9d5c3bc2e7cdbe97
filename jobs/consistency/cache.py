"""Cache-aside reads with stampede protection and invalidation after commit.

    profile = cached("user-profile", str(user_id), lambda: load_profile(user_id), ttl=300)

    with transaction.atomic():
        user.save()
        invalidate_on_commit("user-profile", str(user.pk))   # dropped only if it commits

- A hit is one plain ``MGET`` of the namespace version and the value; a value is
  stored as ``<version>|<pickle>``, so one written under an older version reads
  as a miss. Hits and misses are counted per namespace in the process and added
  to a Redis hash (``HINCRBY``) at most once a second, so every process
  contributes to ``cache_stats()`` without a write on each read.
- On a miss one caller takes a short lease (``SET NX PX``) and loads; the others
  poll for its value and load themselves only if the lease holder gives up. The
  loaded value is written only while its lease is still in place, and
  invalidation deletes the lease with the value: a load that read the database
  before a commit can never put that old value back after the commit.
- ``invalidate_on_commit`` deletes all keys in one DEL (one round trip) after the
  transaction commits; a rolled-back transaction deletes nothing.
- ``bump_namespace`` drops every key of a namespace in O(1): an ``INCR`` of its
  version makes every stored value a miss; they are replaced or age out by TTL.
- ``invalidate_on_commit(..., warm=True)`` enqueues a deduplicated job that
  reloads each key with the loader registered by ``@cache_loader(namespace)``.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

import dramatiq
from django.core.cache import caches
from django.db import transaction
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from jobs.broker import packed
from jobs.broker.scripts import LuaScript
from jobs.conf import jobs_settings
from jobs.consistency.connection import default_redis
from jobs.consistency.dedup import send_unique
from jobs.consistency.outbox import send_on_commit
from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable

logger = logging.getLogger(__name__)

T = TypeVar("T")

PREFIX = "nscache:"
STATS_KEY = PREFIX + "stats"

# KEYS: value key, lease key. ARGV: lease token, lease ms, "<version>|".
# {1, value} if a value of this version is there, {2} if we took the lease, {0} if
# another caller holds it.
_CLAIM = LuaScript("""
local value = redis.call('get', KEYS[1])
if value and string.sub(value, 1, #ARGV[3]) == ARGV[3] then
  return {1, value}
end
if redis.call('set', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {2}
end
return {0}
""")
# KEYS: value key, lease key. ARGV: lease token, value, ttl ms.
_WRITE_IF_LEASED = LuaScript("""
if redis.call('get', KEYS[2]) == ARGV[1] then
  redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3])
  redis.call('del', KEYS[2])
  return 1
end
return 0
""")


class _Counters:
    """Hits and misses of this process, added to Redis at most once per interval."""

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self._mutex = threading.Lock()
        self._pending: dict[str, int] = {}
        self._flushed_at = time.monotonic()

    def count(self, client: Redis, field: str) -> None:
        with self._mutex:
            self._pending[field] = self._pending.get(field, 0) + 1
            due = time.monotonic() - self._flushed_at >= self.interval
        if due:
            self.flush(client)

    def flush(self, client: Redis) -> None:
        with self._mutex:
            pending, self._pending = self._pending, {}
            self._flushed_at = time.monotonic()
        if not pending:
            return
        try:
            pipe = client.pipeline(transaction=False)
            for field, amount in pending.items():
                pipe.hincrby(STATS_KEY, field, amount)
            pipe.execute()
        except RedisError as exc:
            logger.warning("Cache counters not saved: %s", exc)


_counters = _Counters()


def _client() -> Redis:
    return default_redis()


def _codec() -> Any:
    """django-redis's serializer and compressor, so values match ``cache.get``'s."""
    return caches[jobs_settings.JOBS_CACHE].client  # type: ignore[attr-defined]


def _client_and_codec() -> tuple[Redis, Any]:
    codec = _codec()
    return cast(Redis, codec.get_client(write=True)), codec


def _version_key(namespace: str) -> str:
    return f"{PREFIX}{namespace}:version"


def _value_key(namespace: str, key: str) -> str:
    return f"{PREFIX}{namespace}:{key}"


def cached(namespace: str, key: str, loader: Callable[[], T], *, ttl: float = 300) -> T:
    """The cached value of ``key`` in ``namespace``; on a miss, ``loader()`` (one caller).

    With Redis unreachable the answer is ``loader()``'s, uncached: slower, never
    an error (and after one timeout, without waiting on Redis again for a while:
    ``jobs.consistency.reachability``).
    """
    if recently_unreachable():
        return loader()
    client, codec = _client_and_codec()
    value_key = _value_key(namespace, key)
    try:
        version, raw = _read(client, _version_key(namespace), value_key)
    except UNREACHABLE as exc:
        note_unreachable(exc)
        logger.warning("Cache %s: Redis unreachable, loading uncached: %s", value_key, exc)
        return loader()
    stamp = (version or b"0") + b"|"
    if raw is not None and raw.startswith(stamp):
        _counters.count(client, namespace + ":hits")
        return cast(T, codec.decode(raw[len(stamp) :]))
    _counters.count(client, namespace + ":misses")
    return _fill(client, value_key, stamp, loader, ttl)


def _read(client: Redis, version_key: str, value_key: str) -> list[bytes | None]:
    """MGET of the namespace version and the value, packed by hand (a hit is
    this and nothing else; redis-py's own call cost the hit ~5% against a
    plain ``cache.get``). An error goes through the client's own call."""
    command = packed.pack(b"MGET", version_key.encode(), value_key.encode())
    try:
        return cast(list[bytes | None], packed.send(client, command))
    except RedisTimeoutError:
        raise  # a server that does not answer: asking again only doubles the wait
    except (packed.NotSent, RedisConnectionError) as exc:
        if isinstance(exc.__cause__, RedisTimeoutError):
            raise exc.__cause__ from None
        # A read: asking again cannot do anything twice.
        return cast(list[bytes | None], client.mget(version_key, value_key))


def _fill(client: Redis, value_key: str, stamp: bytes, loader: Callable[[], T], ttl: float) -> T:
    lease_key = value_key + ":lease"
    lease_ms = int(jobs_settings.JOBS_CACHE_LEASE_MS)
    deadline = time.monotonic() + lease_ms / 1000
    token = secrets.token_hex(8)
    pause = 0.002
    while True:
        # Re-checks the value with the lease: a loader may have finished since our read.
        try:
            claim = _CLAIM(client, [value_key, lease_key], [token, lease_ms, stamp])
        except UNREACHABLE as exc:
            note_unreachable(exc)
            logger.warning("Cache %s: Redis unreachable, loading uncached: %s", value_key, exc)
            return loader()
        if claim[0] == 1:
            return cast(T, _codec().decode(claim[1][len(stamp) :]))
        if claim[0] == 2:
            return _load(client, value_key, stamp, token, loader, ttl)
        if time.monotonic() >= deadline:
            logger.warning("Cache %s: lease holder too slow, loading uncached", value_key)
            return loader()
        time.sleep(pause)  # another caller is loading: wait for its value
        pause = min(pause * 1.5, 0.05)


def _load(
    client: Redis, value_key: str, stamp: bytes, token: str, loader: Callable[[], T], ttl: float
) -> T:
    try:
        value = loader()
    except BaseException:
        client.delete(value_key + ":lease")  # let a waiter try at once
        raise
    encoded = stamp + _codec().encode(value, allow_int=False)
    # Refused when an invalidation deleted our lease while we loaded: what we
    # loaded may predate that commit, so it must not be cached.
    try:
        _WRITE_IF_LEASED(
            client, [value_key, value_key + ":lease"], [token, encoded, int(ttl * 1000)]
        )
    except UNREACHABLE as exc:
        note_unreachable(exc)  # loaded all the same: the caller gets its value
    return value


def invalidate(namespace: str, *keys: str) -> int:
    """Delete ``keys`` of ``namespace`` (and any loads in flight) now, in one DEL."""
    if not keys:
        return 0
    doomed = [_value_key(namespace, key) + suffix for key in keys for suffix in ("", ":lease")]
    return int(_client().delete(*doomed))


def invalidate_on_commit(namespace: str, *keys: str, warm: bool = False) -> None:
    """Delete ``keys`` once the current transaction commits (now if none is open)."""

    def drop() -> None:
        if recently_unreachable():
            _drop_later(namespace, keys, warm, "Redis unreachable a moment ago")
            return
        try:
            invalidate(namespace, *keys)
        except UNREACHABLE as exc:
            note_unreachable(exc)
            _drop_later(namespace, keys, warm, str(exc))
            return
        if warm:
            _warm(namespace, keys)

    transaction.on_commit(drop, robust=True)


def bump_namespace(namespace: str) -> None:
    """Invalidate every key of ``namespace`` at once, after the current transaction commits."""
    transaction.on_commit(lambda: _client().incr(_version_key(namespace)), robust=True)


def cache_stats() -> dict[str, dict[str, int]]:
    """Hits and misses per namespace, summed over every process: {ns: {"hits", "misses"}}."""
    client = _client()
    _counters.flush(client)  # this process's latest counts; others add theirs each second
    raw = cast(dict[bytes, bytes], client.hgetall(STATS_KEY))
    result: dict[str, dict[str, int]] = {}
    for field, count in raw.items():
        namespace, _, kind = field.decode().rpartition(":")
        result.setdefault(namespace, {"hits": 0, "misses": 0})[kind] = int(count)
    return result


# --- Warm-up after invalidation ------------------------------------------------

_loaders: dict[str, tuple[Callable[[str], Any], float]] = {}


def cache_loader(
    namespace: str, *, ttl: float = 300
) -> Callable[[Callable[[str], T]], Callable[[str], T]]:
    """Register ``fn(key)`` as the loader of ``namespace`` for the warm-up job."""

    def register(fn: Callable[[str], T]) -> Callable[[str], T]:
        _loaders[namespace] = (fn, ttl)
        return fn

    return register


def _warm(namespace: str, keys: tuple[str, ...] | list[str]) -> None:
    for key in keys:
        send_unique(warm_cache_key, f"cache-warm:{namespace}:{key}", namespace, key)


def _drop_later(namespace: str, keys: tuple[str, ...], warm: bool, why: str) -> None:
    """Redis cannot drop the keys now, and a request must not wait on it again.
    Left to their TTL, a Redis that comes back with its data (it hung, or was
    cut off) would serve the old values until they expire; the outbox keeps
    the drop instead, and a worker does it once Redis answers."""
    logger.warning(
        "Cache %s: Redis unreachable (%s); %s dropped once it answers", namespace, why, keys
    )
    send_on_commit(drop_cache_keys, namespace, list(keys), warm)


def registered_namespaces() -> list[str]:
    """Namespaces with a loader: known before any read, so their metrics start at zero."""
    return sorted(_loaders)


@dramatiq.actor(queue_name="cache", time_limit=60_000)
def drop_cache_keys(namespace: str, keys: list[str], warm: bool = False) -> None:
    """An invalidation Redis could not take at commit (``invalidate_on_commit``);
    retried with backoff while Redis does not answer."""
    invalidate(namespace, *keys)
    if warm:
        _warm(namespace, keys)


@dramatiq.actor(queue_name="cache", max_retries=0, time_limit=60_000)
def warm_cache_key(namespace: str, key: str) -> None:
    registered = _loaders.get(namespace)
    if registered is None:
        logger.warning("No cache loader registered for %s; %s not warmed", namespace, key)
        return
    loader, ttl = registered
    cached(namespace, key, lambda: loader(key), ttl=ttl)
