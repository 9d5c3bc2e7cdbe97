"""A worker without our protections: Dramatiq's own RedisBroker and consumer.

``python -m dramatiq tests.e2e.stock_worker_app --queues long`` runs the same
``long_job`` (same name, queue and counters as tests.examples.tasks) with no
heartbeat thread, so a test can show the hazard that thread closes (a busy
worker's heartbeat lapsing, dramatiq issue 692) before it shows its absence.
"""

from __future__ import annotations

import ctypes
import os
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from jobs.conf.redis_urls import split_redis_url

broker_url, _cache_url = split_redis_url("REDIS_URL", os.environ["REDIS_URL"])
timeout_ms = int(os.environ["JOBS_HEARTBEAT_TIMEOUT_MS"])
broker = RedisBroker(url=broker_url, heartbeat_timeout=timeout_ms)  # type: ignore[no-untyped-call]
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="long", max_retries=0, time_limit=10 * 60_000)
def long_job(key: str, seconds: float, gil: bool = False) -> None:
    broker.client.incr(f"long-job:{key}:starts")
    if gil:
        ctypes.PyDLL(None).sleep(int(seconds))  # as tests.examples.tasks.hold_the_gil
    else:
        time.sleep(seconds)
    broker.client.incr(f"long-job:{key}:ends")
