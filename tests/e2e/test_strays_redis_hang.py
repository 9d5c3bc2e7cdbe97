"""Delayed jobs a worker holds in memory survive a Redis that hangs (review finding).

A hung Redis (a stopped process; a host cut off the network) makes redis-py
raise ``redis.TimeoutError`` after the client's ``socket_timeout`` (10 s here),
not a ``ConnectionError``. Before the fix the consumer let it through, so
Dramatiq's consumer thread took its generic-exception branch, whose ``close()``
hands back the delay queue, met the same timeout and ended the thread: the
worker never fetched that delay queue again and the delayed jobs it held ran
only when its process stopped. A real worker subprocess and a real
redis-server, SIGSTOPped then SIGCONTed.

Run: bin/test tests/e2e/test_strays_redis_hang.py -s
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from project.redis_server import RedisServer
from tests.e2e.conftest import free_port
from tests.e2e.test_crash_safety import wait_until
from tests.e2e.test_strays_redis_restart import JOBS, hold_delayed_jobs, starts
from tests.fault_matrix import FaultRow, report

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.django_db(transaction=True),
    pytest.mark.one_row("sqlite", "a broker-side fault (Redis hung)"),
]
HANG_S = 25  # more than two socket timeouts: the fetch's, then the hand-back's


def test_delayed_jobs_a_worker_holds_run_after_redis_hangs(
    start_worker: Any, tmp_path: Path
) -> None:
    redis = RedisServer(free_port(), tmp_path / "redis").start()
    try:
        # Given delayed jobs a worker took and keeps in memory until they are due
        producer, worker = hold_delayed_jobs(start_worker, redis)

        # When Redis hangs (stops answering) for a while, then answers again
        assert redis.process is not None
        os.kill(redis.process.pid, signal.SIGSTOP)
        time.sleep(HANG_S)
        os.kill(redis.process.pid, signal.SIGCONT)

        # Then each delayed job runs once (not when the worker stops)
        took = wait_until(lambda: starts(producer) == [1] * JOBS, timeout=60)
        print(f"\nafter a Redis hang: runs {starts(producer)}, {took:.1f} s after it answered")
        runs = starts(producer)
        lost, twice = sum(r == 0 for r in runs), sum(max(r - 1, 0) for r in runs)
        report(
            FaultRow("Redis hung (SIGSTOP) with delayed jobs held", JOBS, lost, twice, None, took)
        )
        assert starts(producer) == [1] * JOBS
        assert worker.terminate() == 0
    finally:
        if redis.process is not None and redis.process.poll() is None:
            os.kill(redis.process.pid, signal.SIGCONT)
        redis.stop()
