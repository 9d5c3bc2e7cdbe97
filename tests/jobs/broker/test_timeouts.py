"""Redis timeouts per kind of process (jobs.conf.timeouts, jobs.broker.timeouts)."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
from django.core.cache import caches
from redis import ConnectionPool

from jobs.broker import redis_broker
from jobs.broker.timeouts import retime
from jobs.conf import dramatiq_broker, redis_cache
from jobs.conf.timeouts import REQUEST, WORKER_BROKER, WORKER_CACHE, Timeouts


def timeouts(pool: ConnectionPool) -> Timeouts:
    kwargs = pool.connection_kwargs
    return Timeouts(kwargs["socket_connect_timeout"], kwargs["socket_timeout"])


def cache_pool() -> ConnectionPool:
    pool: ConnectionPool = caches["default"].client.get_client().connection_pool  # type: ignore[attr-defined]
    return pool


def test_the_settings_builders_give_every_process_a_requests_timeouts() -> None:
    broker = dramatiq_broker("redis://127.0.0.1:6379/0")
    assert "socket_timeout=0.75" in broker["OPTIONS"]["url"]
    assert "socket_connect_timeout=0.5" in broker["OPTIONS"]["url"]
    cache = redis_cache("redis://127.0.0.1:6379/1")
    assert (cache["OPTIONS"]["SOCKET_CONNECT_TIMEOUT"], cache["OPTIONS"]["SOCKET_TIMEOUT"]) == (
        REQUEST.connect,
        REQUEST.read,
    )


@pytest.mark.django_db(transaction=True)
def test_a_worker_raises_them_before_its_threads_use_redis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a process with a request's timeouts (an in-process worker may have
    # raised them already in this test session)
    broker = redis_broker()
    for pool in (broker.client.connection_pool, cache_pool()):
        monkeypatch.setitem(pool.connection_kwargs, "socket_connect_timeout", REQUEST.connect)
        monkeypatch.setitem(pool.connection_kwargs, "socket_timeout", REQUEST.read)
        pool.reset()
    broker.client.ping()  # a connection made before the boot, with a request's timeout

    # When a worker boots in it
    worker = dramatiq.Worker(broker, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        # Then the broker and the cache take the worker's, and the fetch's wait
        # on the wake list follows (half the read timeout)
        assert timeouts(broker.client.connection_pool) == WORKER_BROKER
        connection = broker.client.connection_pool.get_connection()
        try:  # not the one made before: a new one, with the worker's timeout
            assert connection.socket_timeout == WORKER_BROKER.read
        finally:
            broker.client.connection_pool.release(connection)
        assert timeouts(cache_pool()) == WORKER_CACHE
        consumers: list[Any] = [thread.consumer for thread in worker.consumers.values()]
        assert {c.max_wait_ms for c in consumers if hasattr(c, "max_wait_ms")} == {5_000}
    finally:
        worker.stop()


def test_a_longer_timeout_set_in_the_url_stays() -> None:
    pool = ConnectionPool.from_url(
        "redis://127.0.0.1:1/0?socket_timeout=30&socket_connect_timeout=1"
    )
    retime(pool, WORKER_BROKER)
    assert timeouts(pool) == Timeouts(connect=WORKER_BROKER.connect, read=30)
