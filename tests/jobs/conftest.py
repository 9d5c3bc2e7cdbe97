from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import dramatiq
import pytest
from django.conf import settings

from jobs.broker import redis_broker, replication
from jobs.middleware.dedup import Dedup
from tests.ha.cluster import Process, data_server


@pytest.fixture
def dedup_middleware(broker: dramatiq.Broker) -> Iterator[Dedup]:
    """The Dedup middleware the settings put on the broker."""
    [middleware] = [m for m in broker.middleware if isinstance(m, Dedup)]
    yield middleware
    assert middleware in broker.middleware


@pytest.fixture
def subprocess_env(test_database_url: str) -> dict[str, str]:
    """Environment for ``python -m tests.jobs.<helper>`` sharing this test's database and Redis."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.worker_settings",  # shipped settings + example actors
        "DATABASE_URL": test_database_url,
        "REDIS_URL": settings.REDIS_URL,
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def start_replica(tmp_path: Path) -> Iterator[Callable[[], Process]]:
    """Start a real replica of the session's Redis; it is gone after the test.

    Returns once it acknowledges the primary's writes and the broker's replica
    gauge (``jobs.broker.replication``) counts it.
    """
    primary = urlsplit(settings.REDIS_URL)
    if primary.hostname not in ("127.0.0.1", "localhost") or primary.password:
        pytest.skip(reason="a replica needs the session's own local Redis, not REDIS_URL's")
    started: list[Process] = []
    # Redis 7 waits 5 s for more replicas before a diskless full sync: none will come.
    redis_broker().client.config_set("repl-diskless-sync-delay", 0)

    def start() -> Process:
        assert primary.port is not None
        directory = tmp_path / f"replica{len(started)}"
        replica = data_server("replica", directory, replica_of=primary.port)
        started.append(replica)
        wait_until_replicated()
        wait_for_gauge(1)
        return replica

    yield start
    for replica in started:
        replica.process.send_signal(signal.SIGCONT)  # a test may have frozen it
        replica.kill()
    if started:
        # The gauge may count a replica for a second after it died: not into the next test.
        wait_for_gauge(0)


def wait_until_replicated(timeout: float = 10.0) -> None:
    """Until a replica acknowledges the primary's writes.

    Redis 7 lists a replica "online" as soon as its full copy is sent, but
    streams it writes only once it acknowledged loading that copy (within a
    second): a WAIT in between finds no replica.
    """
    client = redis_broker().client
    deadline = time.monotonic() + timeout
    while True:
        pipe = client.pipeline(transaction=False)
        pipe.set("test:replicated", 1)
        pipe.execute_command("WAIT", 1, 100)
        if pipe.execute()[-1] >= 1:
            client.delete("test:replicated")
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the replica never acknowledged a write")


def wait_for_gauge(online: int, timeout: float = 10.0) -> None:
    """Until the broker's replica gauge counts ``online`` replicas (it asks once a second)."""
    gauge = replication.gauge_for(redis_broker().client)
    deadline = time.monotonic() + timeout
    while not gauge.can_confirm(online) or gauge.can_confirm(online + 1):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the replica gauge never counted {online} replicas online")
        time.sleep(0.05)
