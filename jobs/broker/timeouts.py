"""A worker process (and the scheduler) raises its Redis timeouts when it boots.

Every process starts with the request's timeouts (``jobs.conf.timeouts``): a web
request, a shell or a management command pays at most one short wait on a hung
Redis, and ``jobs.consistency.reachability`` spares it the next ones. A worker
blocks on Redis for its fetch and runs longer scripts, so ``Preflight`` and
``runscheduler`` call ``use_worker_timeouts`` before their threads start.

redis-py never sends a timed-out command again by itself (a client made from a
URL retries nothing); the callers that do (the outbox's relay) first ask Redis
whether the command took effect.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.cache import caches
from dramatiq.brokers.redis import RedisBroker
from redis import ConnectionPool

from jobs.conf.timeouts import WORKER_BROKER, WORKER_CACHE, Timeouts

logger = logging.getLogger(__name__)


def use_worker_timeouts(broker: RedisBroker) -> None:
    """This process is a worker (or the scheduler): give its Redis clients the
    worker's timeouts. Call before its threads use Redis: connections already
    open keep their timeouts until they are closed."""
    retime(broker.client.connection_pool, WORKER_BROKER)
    for pool in _cache_pools():
        retime(pool, WORKER_CACHE)


def retime(pool: ConnectionPool, timeouts: Timeouts) -> None:
    """Raise ``pool``'s timeouts to at least ``timeouts`` for the connections it
    opens from now on; a longer timeout set in the URL stays."""
    kwargs = pool.connection_kwargs
    changed = False
    for key, seconds in (
        ("socket_connect_timeout", timeouts.connect),
        ("socket_timeout", timeouts.read),
    ):
        current = kwargs.get(key)
        if current is not None and current < seconds:
            kwargs[key] = seconds
            # redis-py 8 goes back to the "orig_" value after a server's
            # maintenance notice: the worker's, from now on.
            if f"orig_{key}" in kwargs:
                kwargs[f"orig_{key}"] = seconds
            changed = True
    if changed:
        # Connections made so far keep the timeouts they were made with: close
        # the idle ones and forget them all, so the pool makes new ones (one
        # in use now is closed by its own pool's check when it comes back).
        pool.disconnect(inuse_connections=False)
        pool.reset()


def _cache_pools() -> list[ConnectionPool]:
    """The connection pools behind every django-redis cache of the project."""
    pools: list[ConnectionPool] = []
    for alias, config in settings.CACHES.items():
        if not str(config.get("BACKEND", "")).startswith("django_redis."):
            continue
        client = caches[alias].client  # type: ignore[attr-defined]
        for index in range(len(client._server)):
            try:
                pool = client.connect(index).connection_pool
            except Exception:  # a client class of the adopter's own
                logger.debug("Cache %r: no connection pool to retime", alias, exc_info=True)
                continue
            if pool not in pools:
                pools.append(pool)
    return pools
