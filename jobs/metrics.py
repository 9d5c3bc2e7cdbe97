"""Prometheus metrics of the job platform.

Counters, gauges and histograms below are recorded in every process (web,
workers, scheduler). In multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, set by
the settings) each process writes its own files and ``GET /metrics`` sums them,
so workers' figures appear on the web's endpoint. Figures that live in Redis or
the database (queue depth, cache hit counts, live workers, stuck jobs) are read
at scrape time by ``StateCollector``.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from prometheus_client import Counter, Gauge, Histogram, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

# Files are named by host and pid, not pid alone: containers sharing one
# metrics volume (docker-compose) each have their own pid 1, 7, ...
_HOST = socket.gethostname().replace("_", "-")


def process_identifier(pid: int | None = None) -> str:
    return f"{_HOST}-{os.getpid() if pid is None else pid}"


if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    values.ValueClass = values.MultiProcessValue(  # type: ignore[no-untyped-call]
        process_identifier=process_identifier
    )

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900)
WAIT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

JOBS = Counter("jobs_processed_total", "Jobs finished, by outcome", ["actor", "queue", "outcome"])
RETRIES = Counter("jobs_retries_total", "Failed attempts that will be retried", ["actor", "queue"])
IN_PROGRESS = Gauge(
    "jobs_in_progress", "Jobs running now", ["actor", "queue"], multiprocess_mode="livesum"
)
DURATION = Histogram(
    "jobs_duration_seconds", "Time of one attempt", ["actor", "queue"], buckets=DURATION_BUCKETS
)
ENQUEUED = Counter("jobs_enqueued_total", "Messages enqueued", ["actor", "queue"])

LOCK_WAIT = Histogram(
    "jobs_lock_wait_seconds", "Time waited to acquire a Redis lock", buckets=WAIT_BUCKETS
)
LOCK_TIMEOUTS = Counter("jobs_lock_timeouts_total", "Locks not acquired within their wait bound")
LOCKS_HELD = Gauge("jobs_locks_held", "Redis locks held now", multiprocess_mode="livesum")
LOCKS_LOST = Counter("jobs_locks_lost_total", "Locks lost while held (expired or taken)")

SIGNUPS = Counter("signups_total", "Users registered")
LEDGER_WRITE_FAILURES = Counter(
    "jobs_ledger_write_failures_total", "Ledger writes that failed (the jobs still ran)"
)


class StateCollector(Collector):
    """Reads queue depth, cache counters, workers and stuck jobs at scrape time."""

    def collect(self) -> Iterator[Metric]:
        from jobs import queues
        from jobs.cache import cache_stats
        from jobs.workers import live_workers

        waiting = GaugeMetricFamily("jobs_queue_waiting", "Messages waiting", labels=["queue"])
        delayed = GaugeMetricFamily(
            "jobs_queue_delayed", "Messages delayed (scheduled or backing off)", labels=["queue"]
        )
        dead = GaugeMetricFamily("jobs_queue_dead", "Messages dead-lettered", labels=["queue"])
        oldest = GaugeMetricFamily(
            "jobs_queue_oldest_age_seconds", "Age of the oldest waiting message", labels=["queue"]
        )
        paused = GaugeMetricFamily(
            "jobs_queue_paused", "1 if the queue is paused", labels=["queue"]
        )
        try:
            for stat in queues.all_queue_stats():
                waiting.add_metric([stat.name], stat.waiting)
                delayed.add_metric([stat.name], stat.delayed)
                dead.add_metric([stat.name], stat.dead)
                oldest.add_metric([stat.name], stat.oldest_waiting_age_s or 0.0)
                paused.add_metric([stat.name], 1 if stat.paused else 0)
        except Exception:
            logger.warning("Could not read queue state for metrics", exc_info=True)
        yield from (waiting, delayed, dead, oldest, paused)

        hits = CounterMetricFamily("jobs_cache_hits", "Cache hits", labels=["namespace"])
        misses = CounterMetricFamily("jobs_cache_misses", "Cache misses", labels=["namespace"])
        try:
            for namespace, counts in sorted(cache_stats().items()):
                hits.add_metric([namespace], counts["hits"])
                misses.add_metric([namespace], counts["misses"])
        except Exception:
            logger.warning("Could not read cache counters for metrics", exc_info=True)
        yield from (hits, misses)

        workers = GaugeMetricFamily("jobs_workers_alive", "Worker processes with a fresh heartbeat")
        try:
            workers.add_metric([], len(live_workers()))
        except Exception:
            logger.warning("Could not read worker heartbeats for metrics", exc_info=True)
        yield workers

        stuck = GaugeMetricFamily(
            "jobs_running_over_time_limit",
            "Jobs recorded as running for longer than the default time limit plus grace",
        )
        try:
            stuck.add_metric([], _stuck_jobs())
        except Exception:
            logger.warning("Could not count stuck jobs for metrics", exc_info=True)
        yield stuck


def _stuck_jobs() -> int:
    from jobs import states
    from jobs.models import Job

    limit = timedelta(milliseconds=settings.JOBS_TIME_LIMIT_MS, seconds=settings.WATCHDOG_GRACE_S)
    return Job.objects.filter(state=states.RUNNING, started_at__lt=timezone.now() - limit).count()
