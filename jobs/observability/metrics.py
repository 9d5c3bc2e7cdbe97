"""Prometheus metrics of the job platform.

Counters, gauges and histograms below are recorded in every process (web,
workers, scheduler). In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set by
the settings) each process writes its own files and ``GET /metrics`` sums them,
so workers' figures appear on the web's endpoint. Figures that live in Redis or
the database (queue depth, cache hit counts, live workers, stuck jobs) are read
at scrape time by ``jobs.observability.collector.StateCollector``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket

from prometheus_client import Counter, Gauge, Histogram, values

logger = logging.getLogger(__name__)

# Files are named by host and pid, not pid alone: containers sharing one
# metrics volume (docker-compose) each have their own pid 1, 7, ...
_HOST = socket.gethostname().replace("_", "-")


def process_identifier(pid: int | None = None) -> str:
    return f"{_HOST}-{os.getpid() if pid is None else pid}"


def host_identifier() -> str:
    """This host's part of ``process_identifier`` (no "_" in it)."""
    return _HOST


def forget_previous_process() -> None:
    """Remove the live gauge files a dead process of this host and pid left (a
    restarted container reuses both): prometheus_client would read their values
    as this process's own, and a job the dead one ran would show in progress
    for good. Nothing of this process is in them yet (called before it writes)."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        from prometheus_client import multiprocess

        with contextlib.suppress(OSError):
            multiprocess.mark_process_dead(process_identifier(), directory)  # type: ignore[no-untyped-call]


if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    values.ValueClass = values.MultiProcessValue(  # type: ignore[no-untyped-call]
        process_identifier=process_identifier
    )
    forget_previous_process()
    # A forked child (a Dramatiq worker process, a gunicorn worker) gets a pid
    # of its own, whose files a dead process may have left too.
    os.register_at_fork(after_in_child=forget_previous_process)

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

OUTCOMES = ("succeeded", "failed", "retried", "skipped", "cancelled")
JOBS = Counter("jobs_processed_total", "Jobs finished, by outcome", ["actor", "queue", "outcome"])
RETRIES = Counter("jobs_retries_total", "Failed attempts that will be retried", ["actor", "queue"])
DEFERRED = Counter(
    "jobs_deferred_total",
    "Deliveries put back for later as the same attempt (a full rate limit)",
    ["actor", "queue"],
)
IN_PROGRESS = Gauge(
    "jobs_in_progress", "Jobs running now", ["actor", "queue"], multiprocess_mode="livesum"
)
PROGRESS = Gauge(
    "jobs_progress_ratio",
    "Share done (0-1) in the latest progress report of a job of this actor",
    ["actor", "queue"],
    multiprocess_mode="livemostrecent",
)
DURATION = Histogram(
    "jobs_duration_seconds", "Time of one attempt", ["actor", "queue"], buckets=DURATION_BUCKETS
)
ENQUEUED = Counter("jobs_enqueued_total", "Messages enqueued", ["actor", "queue"])
# Per-key concurrency (jobs.concurrency): jobs set aside because their key was
# full, and how long they waited for a slot.
PARKED = Counter(
    "jobs_parked_total", "Jobs set aside because their concurrency key was full", ["actor", "queue"]
)
SLOT_WAIT = Histogram(
    "jobs_slot_wait_seconds",
    "Time a parked job waited for a concurrency slot",
    ["actor", "queue"],
    buckets=(*WAIT_BUCKETS, 60, 300, 900, 3600),  # a key may stay full for minutes
)

LOCK_WAIT = Histogram(
    "jobs_lock_wait_seconds", "Time waited to acquire a Redis lock", buckets=WAIT_BUCKETS
)
LOCK_TIMEOUTS = Counter("jobs_lock_timeouts_total", "Locks not acquired within their wait bound")
LOCKS_HELD = Gauge("jobs_locks_held", "Redis locks held now", multiprocess_mode="livesum")
LOCKS_LOST = Counter("jobs_locks_lost_total", "Locks lost while held (expired or taken)")

LEDGER_WRITE_FAILURES = Counter(
    "jobs_ledger_write_failures_total", "Ledger writes that failed (the jobs still ran)"
)
