"""Redis read timeouts: short where a person waits, long where a worker blocks.

The settings' clients (``jobs.conf.broker``) read with a 1 s timeout: a web
request, a management command or the scheduler must not hang on a stalled
Redis (``jobs.consistency.reachability`` then spares them the next waits). A
worker process and its pulse wait on Redis on purpose (``BLPOP`` for up to half
the timeout, long scripts, acks held until Redis answers) and switch their
pools to the longer timeouts below when they boot.
"""

from __future__ import annotations

from typing import Any

import dramatiq

WORKER_BROKER_TIMEOUT_S = 10.0
WORKER_CACHE_TIMEOUT_S = 2.0


def use_worker_timeouts(broker: dramatiq.Broker) -> None:
    """Give this process's broker and cache pools the workers' read timeouts."""
    from jobs.consistency.connection import default_redis

    client = getattr(broker, "client", None)
    if client is not None:
        _set(client.connection_pool, WORKER_BROKER_TIMEOUT_S)
    _set(default_redis().connection_pool, WORKER_CACHE_TIMEOUT_S)


def _set(pool: Any, seconds: float) -> None:
    pool.connection_kwargs["socket_timeout"] = seconds
    # Connections opened before (Django's set-up) reconnect with the new timeout.
    pool.disconnect()
