"""Held acks across a Redis outage (jobs/broker/acks.py, BatchWriter._release/flush).

* Acks held while the ledger waited, Redis restarted (AOF) meanwhile: once the
  ledger writes, the acks are retried (ConnectionError, then NoScriptError ->
  SCRIPT LOAD) and all land.
* A worker stopped while Redis is down waits for its acks (a batch counts as
  settled only once its acks are sent), so no job that ended runs again.

Run: bin/test tests/e2e/test_acks_redis_restart.py -s   (also with --postgres)
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from jobs.models import Job
from project.redis_server import RedisServer
from tests.e2e.conftest import free_port
from tests.e2e.test_crash_safety import wait_until
from tests.fault_matrix import FaultRow, report
from tests.jobs.broker.test_acks import ledger_writes_blocked

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
READY = "Worker process is ready for action."
JOBS = 6


def send_jobs(producer: RedisBroker, prefix: str) -> list[dramatiq.Message[Any]]:
    messages = []
    for n in range(JOBS):
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name="long",
            actor_name="long_job",
            args=(f"{prefix}{n}", 0),
            kwargs={},
            options={},
        )
        messages.append(producer.enqueue(message))
    return messages


def starts(producer: RedisBroker, prefix: str) -> list[int]:
    return [int(producer.client.get(f"long-job:{prefix}{n}:starts") or 0) for n in range(JOBS)]


def unacked(producer: RedisBroker) -> int:
    return int(producer.client.hlen("dramatiq:long.msgs"))


def test_held_acks_are_sent_after_a_redis_restart(start_worker: Any, tmp_path: Path) -> None:
    redis = RedisServer(free_port(), tmp_path / "redis").start()
    try:
        producer = RedisBroker(url=redis.url)  # type: ignore[no-untyped-call]
        worker = start_worker(env={"REDIS_URL": redis.url}, threads=2, queues=("long",))
        worker.wait_for_log(READY)
        with ledger_writes_blocked():
            # Given jobs that ended while the ledger could not write (acks held)
            messages = send_jobs(producer, "restart-")
            wait_until(lambda: sum(starts(producer, "restart-")) == JOBS, timeout=15)
            time.sleep(0.5)
            assert unacked(producer) == JOBS
            # When Redis restarts meanwhile
            redis.stop()
            redis.start()
        # Then once the ledger writes, every ack lands and nothing ran twice
        wait_until(lambda: unacked(producer) == 0, timeout=20)
        assert starts(producer, "restart-") == [1] * JOBS
        ids = [m.message_id for m in messages]
        assert Job.objects.filter(message_id__in=ids, state="succeeded").count() == JOBS
        assert worker.terminate() == 0
    finally:
        redis.stop()


def test_a_worker_stopped_while_redis_is_down_keeps_its_acks(
    start_worker: Any, tmp_path: Path
) -> None:
    env = {"JOBS_HEARTBEAT_TIMEOUT_MS": "2000"}
    redis = RedisServer(free_port(), tmp_path / "redis").start()
    try:
        producer = RedisBroker(url=redis.url)  # type: ignore[no-untyped-call]
        worker = start_worker(env={**env, "REDIS_URL": redis.url}, threads=2, queues=("long",))
        worker.wait_for_log(READY)
        with ledger_writes_blocked():
            # Given jobs that ended while the ledger could not write (acks held)
            messages = send_jobs(producer, "down-")
            wait_until(lambda: sum(starts(producer, "down-")) == JOBS, timeout=15)
            time.sleep(0.5)
            # and Redis goes down (a restart, a failover) before the ledger writes
            redis.stop()
        time.sleep(1)  # the ledger writes; the acks fail and wait for a retry

        # When the worker is asked to stop (a deploy) and Redis is back 3 s later,
        # well within the worker's shutdown timeout (5 s here, 10 min shipped)
        stopping_at = time.monotonic()
        worker.process.send_signal(__import__("signal").SIGTERM)
        time.sleep(3)
        redis.start()
        code = worker.process.wait(timeout=30)
        stopped_after = time.monotonic() - stopping_at
        left_unacked = unacked(producer)

        # (a peer takes over whatever the stopped worker left unacked)
        peer = start_worker(env={**env, "REDIS_URL": redis.url}, threads=2, queues=("long",))
        peer.wait_for_log(READY)
        time.sleep(6)
        runs = starts(producer, "down-")
        ids = [m.message_id for m in messages]
        succeeded = Job.objects.filter(message_id__in=ids, state="succeeded").count()
        print(
            f"\nworker exited {code} after {stopped_after:.1f} s with {left_unacked} "
            f"finished job(s) unacked; runs per job {runs}; succeeded rows {succeeded}; "
            f"'Could not ack' logged: {'Could not ack' in worker.log()}"
        )
        report(
            FaultRow(
                "Redis down while a stopping worker acks",
                JOBS,
                sum(r == 0 for r in runs),
                sum(max(r - 1, 0) for r in runs),
                JOBS - succeeded,
            )
        )
        # Then the finished jobs were acked before the worker left: none ran twice
        assert left_unacked == 0
        assert runs == [1] * JOBS
    finally:
        redis.stop()
