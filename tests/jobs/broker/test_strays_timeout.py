"""A Redis that hangs (a timeout, not a refused connection) must not end a
consumer thread that holds delayed messages (review finding, jobs/broker/strays.py).

redis-py raises ``redis.TimeoutError`` (not a ``ConnectionError``) when Redis
stops answering for ``socket_timeout`` (a stopped process, a partitioned
host). The consumer does not turn it into Dramatiq's ``ConnectionClosed``, so
Dramatiq's ConsumerThread takes its generic-exception branch, whose
``close()`` hands back the delay queue; that hand-back meets the same timeout,
which ``close()`` does not catch, and the consumer thread ends for good: the
worker never fetches that delay queue again, and the delayed messages it held
stay in its ack set until the process exits (the strays hand-back never runs:
there is no next consumer).

Run: bin/test tests/jobs/broker/test_strays_timeout.py
"""

from __future__ import annotations

import time
from typing import Any

import dramatiq
import pytest
import redis

from tests.e2e.test_crash_safety import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "strays-timeout"
dramatiq.get_broker().declare_queue(QUEUE)
runs: list[str] = []


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def delayed_job(key: str) -> None:
    runs.append(key)


def test_a_redis_timeout_does_not_end_the_delay_queue_consumer(broker, monkeypatch):
    runs.clear()
    worker = dramatiq.Worker(broker, worker_timeout=100, worker_threads=1, queues={QUEUE})
    worker.start()
    try:
        delayed_job.send_with_options(args=("soon",), delay=2500)
        acks = f"{broker.namespace}:__acks__.{broker.broker_id}.{QUEUE}.DQ"
        wait_until(lambda: broker.client.scard(acks) == 1, timeout=15, every=0.05)
        consumer_thread = worker.consumers[f"{QUEUE}.DQ"]

        # Redis hangs for a moment: each fetch and hand-back times out
        def hangs(*args: Any, **kwargs: Any) -> Any:
            raise redis.TimeoutError("Timeout reading from socket")

        monkeypatch.setattr(broker, "do_fetch", hangs)
        monkeypatch.setattr(broker, "do_requeue", hangs)
        time.sleep(1)
        monkeypatch.undo()

        # Then the delay-queue consumer lives on and the job runs once it is due
        assert consumer_thread.is_alive(), "the delay-queue consumer thread ended"
        wait_until(lambda: runs == ["soon"], timeout=15, every=0.05)
    finally:
        monkeypatch.undo()
        worker.stop()
