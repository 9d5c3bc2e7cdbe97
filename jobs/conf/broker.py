"""Settings builders for a project: ``DRAMATIQ_BROKER`` and a ``CACHES`` entry.

``DRAMATIQ_BROKER["MIDDLEWARE"]`` replaces Dramatiq's defaults, so a hand-written
list that forgets one entry silently drops its behaviour (retries, time limits,
the ledger). ``dramatiq_broker()`` writes the whole list out, in the order the
hooks need; ``jobs.conf.checks`` reports a list that lacks one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from jobs.conf.redis_urls import check_redis_url, with_db, with_options
from jobs.conf.sentinels import cache_location, parse_master, parse_sentinels
from jobs.conf.timeouts import REQUEST

# Dramatiq runs before_* hooks in this order and after_* hooks in reverse.
MIDDLEWARE: tuple[str, ...] = (
    # a worker process on a database with unapplied migrations refuses to start
    "jobs.middleware.preflight.Preflight",
    # first in, last out: connections are tidied after the ledger wrote
    # (django-dramatiq's DbConnectionsMiddleware, skipping threads that never
    # used the database)
    "jobs.middleware.connections.DbConnections",
    "dramatiq.middleware.AgeLimit",
    "jobs.middleware.time_limit.TimeLimit",
    "dramatiq.middleware.ShutdownNotifications",
    "jobs.middleware.callbacks.Callbacks",  # failure text printable and masked
    "dramatiq.middleware.Pipelines",
    "dramatiq.middleware.CurrentMessage",
    # request id into messages; job id, actor, attempt, queue onto log lines
    "jobs.observability.logcontext.JobLogContext",
    # a paused or cancelled message is turned away before the ledger marks it running
    "jobs.middleware.control.Control",
    # after Retries has failed or re-enqueued a message, metrics and ledger record it
    "jobs.middleware.metrics.Metrics",
    "jobs.middleware.ledger.Ledger",
    "jobs.middleware.retries.Retries",
    # periodiq's option check (periodic=, catch_up=) and stale-tick skipping
    "jobs.middleware.periodic.Periodic",
    # frees send_unique() keys once a job is finished for good
    "jobs.middleware.dedup.Dedup",
    # publishes outbox rows that could not be sent at commit (broker down)
    "jobs.middleware.outbox.OutboxRelay",
    # arguments checked against the actor's signature
    "jobs.middleware.payloads.Payloads",
    # per-key concurrency: a job's slot freed as soon as it ends (jobs.concurrency)
    "jobs.middleware.concurrency.Concurrency",
    # last: a cancelled job is stopped only while its own code runs; progress flushed
    "jobs.middleware.running.RunningJobs",
)

# A request's timeouts: a worker raises them when it boots (jobs.conf.timeouts).
BROKER_SOCKET_OPTIONS = {
    "socket_connect_timeout": REQUEST.connect,
    "socket_timeout": REQUEST.read,
}


def _sentinels(
    sentinels: str | Sequence[tuple[str, int]] | None, master: str | None
) -> tuple[list[tuple[str, int]], str] | None:
    if not sentinels and not master:
        return None
    if not sentinels or not master:
        raise ValueError("sentinels and sentinel_master go together: pass both or neither")
    parsed = (
        parse_sentinels("sentinels", sentinels) if isinstance(sentinels, str) else list(sentinels)
    )
    return parsed, parse_master("sentinel_master", master)


def dramatiq_broker(
    url: str,
    *,
    db: int | None = None,
    sentinels: str | Sequence[tuple[str, int]] | None = None,
    sentinel_master: str | None = None,
    heartbeat_timeout_ms: int = 15_000,
    instant_wakeup: bool = True,
    extra_middleware: Iterable[str] = (),
) -> dict[str, Any]:
    """``DRAMATIQ_BROKER`` for the platform's Redis broker with all its middleware.

    ``url`` is the broker's Redis (``redis://``, ``rediss://`` or ``unix://``);
    ``db`` replaces its database number (one ``REDIS_URL`` for broker and cache).
    With ``sentinels`` (``"host:port,host:port"``) and ``sentinel_master`` the
    primary is found through Sentinel; the URL still gives password and db.
    A worker silent for ``heartbeat_timeout_ms`` is presumed dead and its jobs
    redelivered. ``extra_middleware`` runs after the platform's, before the actor.
    """
    check_redis_url("dramatiq_broker(url)", url)
    if db is not None:
        url = with_db(url, db)
    sentinel = _sentinels(sentinels, sentinel_master)
    return {
        "BROKER": "jobs.broker.wakeup.WakeupRedisBroker",
        "OPTIONS": {
            "url": with_options(url, **BROKER_SOCKET_OPTIONS),
            "heartbeat_timeout": heartbeat_timeout_ms,
            "instant_wakeup": instant_wakeup,
            "sentinels": sentinel[0] if sentinel else None,
            "sentinel_master": sentinel[1] if sentinel else None,
        },
        "MIDDLEWARE": [*MIDDLEWARE, *extra_middleware],
    }


def redis_cache(
    url: str,
    *,
    db: int | None = None,
    sentinels: str | Sequence[tuple[str, int]] | None = None,
    sentinel_master: str | None = None,
    key_prefix: str = "",
) -> dict[str, Any]:
    """A ``CACHES`` entry for django-redis that the platform can lock and count with.

    Use a database number other than the broker's (``db``, or the URL's), so
    flushing the cache never drops queued jobs. Under Sentinel every read goes to
    the primary (a lagging replica would serve a value just invalidated after a
    commit).
    """
    check_redis_url("redis_cache(url)", url)
    if db is not None:
        url = with_db(url, db)
    cache: dict[str, Any] = {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": url,
        "KEY_PREFIX": key_prefix,
        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.DefaultClient",
            "SOCKET_CONNECT_TIMEOUT": REQUEST.connect,
            "SOCKET_TIMEOUT": REQUEST.read,
        },
    }
    sentinel = _sentinels(sentinels, sentinel_master)
    if sentinel is not None:
        cache["LOCATION"] = cache_location(sentinel[1], url)
        cache["OPTIONS"]["CONNECTION_FACTORY"] = "django_redis.pool.SentinelConnectionFactory"
        cache["OPTIONS"]["SENTINELS"] = sentinel[0]
    return cache
