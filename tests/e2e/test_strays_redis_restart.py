"""Delayed jobs a worker holds in memory survive a Redis restart (jobs/broker/strays.py).

Dramatiq's consumer thread forgets its delay queue on a connection error; the
messages stay in the live worker's ack set, which maintenance never requeues
while the worker beats, so before the fix they ran only once the worker
process stopped. A real worker subprocess, a real redis-server restarted
(AOF keeps the ack set), as a restart or a failover does.

Run: bin/test tests/e2e/test_strays_redis_restart.py -s   (also with --postgres)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from project.redis_server import RedisServer
from tests.e2e.conftest import free_port
from tests.e2e.test_crash_safety import wait_until
from tests.fault_matrix import FaultRow, report

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
READY = "Worker process is ready for action."
JOBS = 3
DELAY_MS = 4000


def held_in_delay_queue(producer: RedisBroker) -> int:
    client = producer.client
    return sum(int(client.scard(key)) for key in client.keys("dramatiq:__acks__.*.long.DQ"))


def starts(producer: RedisBroker) -> list[int]:
    return [int(producer.client.get(f"long-job:delayed-{n}:starts") or 0) for n in range(JOBS)]


def hold_delayed_jobs(start_worker: Any, redis: RedisServer) -> tuple[RedisBroker, Any]:
    """A worker on ``redis`` that took JOBS delayed jobs, not due yet: (producer, worker)."""
    producer = RedisBroker(url=redis.url)  # type: ignore[no-untyped-call]
    worker = start_worker(env={"REDIS_URL": redis.url}, threads=2, queues=("long",))
    worker.wait_for_log(READY)
    for n in range(JOBS):
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name="long", actor_name="long_job", args=(f"delayed-{n}", 0),
            kwargs={}, options={},
        )  # fmt: skip
        producer.enqueue(message, delay=DELAY_MS)
    wait_until(lambda: held_in_delay_queue(producer) == JOBS, timeout=10)
    return producer, worker


def test_delayed_jobs_a_worker_holds_run_after_a_redis_restart(
    start_worker: Any, tmp_path: Path
) -> None:
    redis = RedisServer(free_port(), tmp_path / "redis").start()
    try:
        # Given delayed jobs a worker took and keeps in memory until they are due
        producer, worker = hold_delayed_jobs(start_worker, redis)

        # When Redis restarts before they are due
        redis.stop()
        time.sleep(1)  # the worker's consumers meet the connection error
        redis.start()

        # Then each runs once, soon after it is due (not when the worker stops)
        took = wait_until(lambda: starts(producer) == [1] * JOBS, timeout=30)
        time.sleep(2)  # a second run would show by now
        print(
            f"\ndelayed jobs after a Redis restart: runs {starts(producer)}, all started "
            f"{took:.1f} s after Redis came back; "
            f"'Handed back' logged: {'Handed back' in worker.log()}"
        )
        runs = starts(producer)
        lost, twice = sum(r == 0 for r in runs), sum(max(r - 1, 0) for r in runs)
        report(FaultRow("Redis restarted with delayed jobs held", JOBS, lost, twice, None, took))
        assert starts(producer) == [1] * JOBS
        assert held_in_delay_queue(producer) == 0
        assert worker.terminate() == 0
    finally:
        redis.stop()
