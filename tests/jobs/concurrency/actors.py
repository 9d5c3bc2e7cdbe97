"""Actors and helpers the per-key concurrency tests share: each run of a job
is noted with its key, start and end, to count how many overlapped."""

from __future__ import annotations

import threading
import time
from enum import Enum
from typing import Any

import dramatiq

QUEUE = "slots-test"
# (key, start, end) per run, on this process's monotonic clock.
runs: list[tuple[str, float, float]] = []
runs_lock = threading.Lock()


def _ran(key: str, started: float) -> None:
    with runs_lock:
        runs.append((key, started, time.monotonic()))


@dramatiq.actor(
    queue_name=QUEUE, max_retries=0, concurrency_key="order:{order_id}", concurrency_limit=1
)
def pack(order_id: int, seconds: float) -> None:
    started = time.monotonic()
    time.sleep(seconds)
    _ran(f"order:{order_id}", started)


@dramatiq.actor(
    queue_name=QUEUE, max_retries=0, concurrency_key="tenant:{tenant}", concurrency_limit=2
)
def report(tenant: str, seconds: float) -> None:
    started = time.monotonic()
    time.sleep(seconds)
    _ran(f"tenant:{tenant}", started)


class Tier(str, Enum):  # noqa: UP042 (a StrEnum formats as its value; this does not)
    GOLD = "gold"


@dramatiq.actor(queue_name=QUEUE, max_retries=0, concurrency_key="tier:{tier}", concurrency_limit=1)
def tiered(tier: str, seconds: float) -> None:
    # Sent with Tier.GOLD or "gold": the same job key, as a worker decodes both.
    started = time.monotonic()
    time.sleep(seconds)
    _ran(f"tier:{tier}", started)


# Dramatiq does not check actor names; the fetch's reply carries keyed actors'
# names in a tab-separated string.
@dramatiq.actor(
    actor_name="tabbed\tpack",
    queue_name=QUEUE,
    max_retries=0,
    concurrency_key="tabbed:{order_id}",
    concurrency_limit=1,
)
def tabbed(order_id: int, seconds: float) -> None:
    started = time.monotonic()
    time.sleep(seconds)
    _ran(f"tabbed:{order_id}", started)


def _count(histogram: Any) -> float:
    """Observations of a histogram child so far."""
    return float(sum(bucket.get() for bucket in histogram._buckets))


def most_at_once(key: str) -> int:
    """The largest number of runs of ``key`` that overlapped in time."""
    edges = sorted(
        [(start, 1) for k, start, _ in runs if k == key]
        + [(end, -1) for k, _, end in runs if k == key],
        key=lambda edge: (edge[0], edge[1]),  # an end before a start at the same instant
    )
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def start_worker(workers: list[dramatiq.Worker], broker: dramatiq.Broker, threads: int) -> None:
    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_timeout=50, worker_threads=threads)
    worker.start()
    workers.append(worker)
