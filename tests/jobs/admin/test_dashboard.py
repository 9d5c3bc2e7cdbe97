"""The dashboard's per-actor table: summed from the day chart's hourly buckets."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs.admin.dashboard import dashboard_context
from jobs.ledger.figures import (
    LAST_DAY,
    SETTLED_AFTER,
    ActorFigures,
    state_counts,
    timeline,
)
from jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def finished(actor: str, state: str, ago: timedelta, duration_ms: int | None, n: int = 1) -> None:
    at = timezone.now() - ago
    Job.objects.bulk_create(
        Job(
            message_id=str(uuid.uuid4()),
            actor_name=actor,
            queue_name="q",
            state=state,
            enqueued_at=at,
            finished_at=at,
            duration_ms=duration_ms,
            attempts=1,
        )
        for _ in range(n)
    )


def clear_of_an_hour_settling() -> None:
    """Wait, if need be, so that no hour settles (and is queried once more to be
    cached) in the next 20 s."""
    now = timezone.now()
    settles = now.replace(minute=0, second=0, microsecond=0) + SETTLED_AFTER
    if settles - timedelta(seconds=20) <= now < settles:
        time.sleep((settles - now).total_seconds() + 0.1)


def queries() -> int:
    dashboard_context()  # settled hours are cached by the first read
    with CaptureQueriesContext(connection) as captured:
        dashboard_context()
    return len(captured)


def test_it_makes_as_many_queries_for_seven_actors_as_for_two() -> None:
    clear_of_an_hour_settling()
    # Given two actors with jobs finished in settled hours and in the current one
    for actor in ("a0", "a1"):
        finished(actor, "succeeded", timedelta(hours=3), 20)
        finished(actor, "failed", timedelta(seconds=1), 20)
    two = queries()
    # When five more actors finish jobs
    for i in range(2, 7):
        finished(f"a{i}", "succeeded", timedelta(hours=3), 20)
        finished(f"a{i}", "failed", timedelta(seconds=1), 20)
    seven = queries()
    # Then the dashboard runs the same queries: none per actor
    assert len(dashboard_context()["actors"]) == 7
    assert seven == two, f"{two} queries for 2 actors, {seven} for 7"


def test_the_actor_table_sums_the_day_charts_buckets() -> None:
    # Given, for one actor, 90 jobs of 3 ms three hours ago (a settled, cached hour),
    finished("mailer", "succeeded", timedelta(hours=3), 3, n=90)
    # 6 of 400 ms an hour and a half ago and 4 failures of 400 ms just now,
    finished("mailer", "succeeded", timedelta(minutes=90), 400, n=6)
    finished("mailer", "failed", timedelta(seconds=1), 400, n=4)
    # one skipped (not run) and one finished before the chart's 24 hours;
    finished("mailer", "skipped", timedelta(seconds=1), None)
    finished("mailer", "succeeded", timedelta(hours=30), 3)
    # and an actor whose only job was cancelled
    finished("resizer", "cancelled", timedelta(minutes=5), 40)

    # When the dashboard is read, computing the settled hours and then from the cache
    first, second = dashboard_context(), dashboard_context()

    # Then the mailer has 100 jobs finished, 4 failed, and the p95 lies inside
    # the (250, 500] ms class the 10 slowest fill: 250 + 250 * 5/10. (From the
    # 100 durations themselves it would be 400 ms.) p50 lies inside (0, 5] ms.
    expected = [ActorFigures("mailer", 100, 4, 5 * 50 / 90, 375.0)]
    assert first["actors"] == expected
    assert second["actors"] == expected
    assert timeline(LAST_DAY, cached=False).actors == expected
    assert first["actors_since"] == LAST_DAY.starts(timezone.now())[0].strftime("%H:%M")


def test_the_dashboard_says_how_the_actor_table_is_figured(client: Client) -> None:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    finished("mailer", "succeeded", timedelta(seconds=1), 3)
    since = LAST_DAY.starts(timezone.now())[0].strftime("%H:%M")

    html = client.get("/admin/jobs/job/dashboard/").content.decode()

    assert f"Since {since} UTC, the day chart's 24 hours" in html
    assert "estimated from duration classes" in html


def plan(run: Callable[[], object]) -> str:
    """The query plan of the first query ``run`` makes, an index scan preferred
    wherever one can answer (the test table is too small to prefer one)."""
    with CaptureQueriesContext(connection) as captured:
        run()
    sql = captured[0]["sql"]
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            return " ".join(str(row) for row in cursor.fetchall())
    with connection.cursor() as cursor:
        # The visibility map set, as on any table autovacuum has seen: without
        # it an index-only scan must visit the table anyway, and the planner
        # rightly prefers a plain index scan, whatever the query reads. (Turning
        # enable_indexscan off is no way round: it also disables index-only
        # scans, and the planner then picks any disabled plan.)
        cursor.execute("VACUUM (ANALYZE) jobs_job")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute(f"EXPLAIN {sql}")
        return " ".join(str(row) for row in cursor.fetchall())


@pytest.mark.parametrize(
    "run",
    [
        pytest.param(lambda: state_counts(timedelta(days=1)), id="state_counts"),
    ],
)
def test_the_counts_read_only_an_index(run: Callable[[], object]) -> None:
    finished("mailer", "succeeded", timedelta(seconds=1), 3)
    # A day of some size (three rows are read faster through any index plus the
    # table, and the planner says so), and older days: the day's counts then
    # come from jobs_job_state_enqueued alone.
    for hours in range(1, 24 * 4, 2):
        for state in ("succeeded", "failed"):
            finished("mailer", state, timedelta(hours=hours), 3, n=40)
    text = plan(run)
    if connection.vendor == "sqlite":
        assert "COVERING INDEX" in text, text
    else:
        # COUNT(id) would read the table: neither index holds the id.
        assert "Index Only Scan" in text, text
