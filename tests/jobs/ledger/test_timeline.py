"""The dashboard's timelines: jobs finished per minute and hour, p95 per actor."""

from __future__ import annotations

import time
from datetime import timedelta

import dramatiq
import pytest
from django.core.cache import cache
from django.db import connection
from django.utils import timezone

from jobs.errors import PermanentJobError
from jobs.ledger import writer as ledger
from jobs.ledger.figures import (
    LAST_DAY,
    LAST_HOUR,
    chart_queryset,
    quantile_from_counts,
    timeline,
)
from jobs.models import Job
from tests.conftest import IDLE_POLL_MS, join

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "timeline-test"
failed_once: set[str] = set()


@dramatiq.actor(queue_name=QUEUE, max_retries=2, min_backoff=50, max_backoff=100)
def outcome(kind: str, key: str) -> None:
    if kind == "fail":
        raise PermanentJobError("fails for good")
    if kind == "retry" and key not in failed_once:
        failed_once.add(key)
        raise RuntimeError("fails once")


def clear_of_a_minute_boundary() -> None:
    """Wait, if need be, so that a job mix started now finishes in this minute.

    (Jobs run in about a second; started in a minute's last seconds, some would
    finish in the next minute's bucket, and at :59 in the next hour's.)
    """
    now = timezone.now()
    if now.second >= 45:
        time.sleep(60.1 - now.second - now.microsecond / 1e6)


def run_mix(broker: dramatiq.Broker, succeed: int, fail: int, retry: int) -> None:
    failed_once.clear()  # each run's "retry" jobs fail their first attempt again
    for i in range(succeed):
        outcome.send("ok", f"ok-{i}")
    for i in range(fail):
        outcome.send("fail", f"fail-{i}")
    for i in range(retry):
        outcome.send("retry", f"retry-{i}")
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        join(QUEUE)
    finally:
        worker.stop()
    ledger.flush()


def test_it_counts_jobs_finished_in_the_last_hour_and_day_by_outcome(
    broker: dramatiq.Broker,
) -> None:
    clear_of_a_minute_boundary()
    # Given 4 jobs that succeed, 2 that fail for good, 3 that succeed on a retry
    run_mix(broker, succeed=4, fail=2, retry=3)
    # When the timelines are read
    hour, day = timeline(LAST_HOUR), timeline(LAST_DAY)
    # Then every job is in the current bucket under its outcome
    expected = {"succeeded": 4, "retried": 3, "failed": 2, "skipped": 0, "cancelled": 0}
    assert hour.totals == expected
    assert day.totals == expected
    assert hour.outcomes["failed"][-1] == 2
    assert day.outcomes["retried"][-1] == 3
    assert len(hour.starts) == 60
    assert len(day.starts) == 24
    # and the actor has a p95 in the current bucket only
    assert hour.p95_ms["outcome"][-1] is not None
    assert hour.p95_ms["outcome"][:-1] == [None] * 59


def test_it_puts_each_job_in_the_minute_it_finished() -> None:
    now = timezone.now()
    for minutes_ago in (0, 5, 5, 59, 61):
        finished = now - timedelta(minutes=minutes_ago)
        Job.objects.create(
            message_id=f"m-{minutes_ago}-{Job.objects.count()}",
            actor_name="a",
            queue_name="q",
            state="succeeded",
            enqueued_at=finished,
            finished_at=finished,
            duration_ms=10,
            attempts=1,
        )
    line = timeline(LAST_HOUR, now)
    counts = line.outcomes["succeeded"]
    assert counts[-1] == 1
    assert counts[-6] == 2
    assert counts[0] == 1  # 59 minutes ago: the oldest bucket
    assert sum(counts) == 4  # 61 minutes ago is off the chart


def test_finished_hours_come_from_the_cache_and_the_current_hour_is_live() -> None:
    now = timezone.now()
    two_hours_ago = now - timedelta(hours=2)
    kwargs = {"actor_name": "a", "queue_name": "q", "state": "failed", "duration_ms": 5}
    Job.objects.create(
        message_id="old", enqueued_at=two_hours_ago, finished_at=two_hours_ago, **kwargs
    )
    assert timeline(LAST_DAY, now).totals["failed"] == 1
    # A row written late into a settled hour is not seen until the cache expires...
    Job.objects.create(
        message_id="late", enqueued_at=two_hours_ago, finished_at=two_hours_ago, **kwargs
    )
    Job.objects.create(message_id="new", enqueued_at=now, finished_at=now, **kwargs)
    assert timeline(LAST_DAY, now).totals["failed"] == 2
    # ... and without the cache both are counted
    assert timeline(LAST_DAY, now, cached=False).totals["failed"] == 3
    cache.clear()
    assert timeline(LAST_DAY, now).totals["failed"] == 3


def test_the_p95_interpolates_inside_the_duration_classes() -> None:
    # 100 durations: 90 up to 5 ms (class 0), 10 in (250, 500] ms (class 6)
    counts = {0: 90, 6: 10}
    assert quantile_from_counts(counts, 0.5) == pytest.approx(5 * 50 / 90)
    assert quantile_from_counts(counts, 0.95) == pytest.approx(250 + 250 * 5 / 10)
    assert quantile_from_counts({}, 0.95) is None
    assert quantile_from_counts({15: 3}, 0.95) == 900_000.0  # above every bound


@pytest.mark.skipif(connection.vendor != "sqlite", reason="reads SQLite's query plan")
def test_the_chart_query_reads_only_the_covering_index() -> None:
    sql, params = chart_queryset("hour", timezone.now(), None).query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        plan = " ".join(str(row) for row in cursor.fetchall())
    assert "COVERING INDEX jobs_job_finished_cover" in plan, plan
    assert "SCAN jobs_job" not in plan
