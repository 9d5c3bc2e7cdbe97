"""Figures read at scrape time from Redis and the database: queues, cache, workers.

Kept apart from ``metrics`` (the counters every module increments) because it
reads the state of the other packages, while ``metrics`` depends on none of them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable
from jobs.observability import metrics

logger = logging.getLogger(__name__)
T = TypeVar("T")


class _Skipped(Exception):
    """Redis did not answer this process a moment ago: the figure is left out."""


def _from_redis(read: Callable[[], T]) -> T:
    """``read()``, unless Redis did not answer this process a moment ago: a hung
    Redis would cost each scrape one read timeout per figure (3 s measured)."""
    if recently_unreachable():
        raise _Skipped
    try:
        return read()
    except UNREACHABLE as exc:
        note_unreachable(exc)
        raise


class StateCollector(Collector):
    """Reads queue depth, cache counters, workers and stuck jobs at scrape time."""

    def collect(self) -> Iterator[Metric]:
        from jobs.broker import queues
        from jobs.broker.workers import live_workers
        from jobs.consistency.cache import cache_stats, registered_namespaces

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
        parked = GaugeMetricFamily(
            "jobs_queue_parked",
            "Messages waiting for a concurrency slot (counted in jobs_queue_waiting too)",
            labels=["queue"],
        )
        try:
            for stat in _from_redis(queues.all_queue_stats):
                waiting.add_metric([stat.name], stat.waiting)
                delayed.add_metric([stat.name], stat.delayed)
                dead.add_metric([stat.name], stat.dead)
                oldest.add_metric([stat.name], stat.oldest_waiting_age_s or 0.0)
                paused.add_metric([stat.name], 1 if stat.paused else 0)
                parked.add_metric([stat.name], stat.parked)
        except _Skipped:
            pass  # Redis is away: the figure is left out of this scrape
        except Exception:
            logger.warning("Could not read queue state for metrics", exc_info=True)
        yield from (waiting, delayed, dead, oldest, paused, parked)

        hits = CounterMetricFamily("jobs_cache_hits", "Cache hits", labels=["namespace"])
        misses = CounterMetricFamily("jobs_cache_misses", "Cache misses", labels=["namespace"])
        try:
            # Registered namespaces at zero until their first read, as actors are in
            # declare_known_series: a fresh system shows 0, not nothing.
            known = {namespace: {"hits": 0, "misses": 0} for namespace in registered_namespaces()}
            for namespace, counts in sorted({**known, **_from_redis(cache_stats)}.items()):
                hits.add_metric([namespace], counts["hits"])
                misses.add_metric([namespace], counts["misses"])
        except _Skipped:
            pass  # Redis is away: the figure is left out of this scrape
        except Exception:
            logger.warning("Could not read cache counters for metrics", exc_info=True)
        yield from (hits, misses)

        intake = GaugeMetricFamily(
            "jobs_ledger_intake_waiting",
            "First sends waiting in Redis for the workers to write their ledger rows",
        )
        try:
            intake.add_metric([], _from_redis(_intake_waiting))
        except _Skipped:
            pass  # Redis is away: the figure is left out of this scrape
        except Exception:
            logger.warning("Could not read the ledger intake for metrics", exc_info=True)
        yield intake

        workers = GaugeMetricFamily("jobs_workers_alive", "Worker processes with a fresh heartbeat")
        try:
            workers.add_metric([], len(_from_redis(live_workers)))
        except _Skipped:
            pass  # Redis is away: the figure is left out of this scrape
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


def _intake_waiting() -> int:
    from jobs.broker import redis_broker
    from jobs.ledger.intake import waiting

    broker = redis_broker()
    return waiting(broker)


def _stuck_jobs() -> int:
    from jobs.ledger.figures import stuck_running

    return stuck_running().count()


_declared: set[tuple[str, str]] = set()


def declare_known_series() -> None:
    """Put every declared actor x its queue in this process's per-actor figures, at zero.

    A labelled series only exists once something touched it, so on a fresh system
    ``jobs_processed_total{outcome="failed"}`` of an actor that never failed is
    absent: a dashboard shows nothing rather than 0, and ``rate()`` misses the
    first failures (a series that starts at 1 has no increase). The web process
    calls this before each scrape; the sums over processes then include the zeros.
    """
    import dramatiq
    from dramatiq.common import q_name

    for actor in list(dramatiq.get_broker().actors.values()):
        labels = (actor.actor_name, q_name(actor.queue_name))
        if labels in _declared:
            continue
        for outcome in metrics.OUTCOMES:
            metrics.JOBS.labels(*labels, outcome)
        for family in (
            metrics.RETRIES,
            metrics.DEFERRED,
            metrics.IN_PROGRESS,
            metrics.DURATION,
            metrics.ENQUEUED,
        ):
            family.labels(*labels)
        _declared.add(labels)
