"""On PostgreSQL the ledger's upsert is one prepared statement, bound on the server."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from django.db import connection

from jobs.ledger import states
from jobs.ledger.writer import PHASE_RUNNING, TERMINAL, Event, progress_of, write
from jobs.models import Job

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL only"),
]


def _create() -> dict[str, Any]:
    return {
        "actor_name": "noop",
        "queue_name": "default",
        "args": [1, "x"],
        "kwargs": {},
        "options": {},
        "enqueued_at": datetime.now(UTC),
        "max_attempts": 21,
        "retry_of_id": None,
    }


def _started(message_id: str, attempt: int, pid: int) -> Event:
    return Event(
        message_id,
        states.RUNNING,
        progress_of(attempt - 1, PHASE_RUNNING),
        _create(),
        {
            "attempts": attempt,
            "started_at": datetime.now(UTC),
            "worker_host": "host",
            "worker_pid": pid,
            "next_retry_at": None,
            "redis_message_id": "",
        },
    )


def _upsert_executions() -> dict[str, int]:
    """Each prepared statement of this session that upserts jobs: how often it ran."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, generic_plans + custom_plans FROM pg_prepared_statements "
            "WHERE statement LIKE %s",
            ['INSERT INTO "jobs_job" %'],
        )
        return dict(cursor.fetchall())


def _ran(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: n - before.get(name, 0) for name, n in after.items() if n != before.get(name, 0)}


def test_it_prepares_the_upsert_once_and_runs_it_for_every_job() -> None:
    # Given a batch of job starts whose integers need every size of PostgreSQL
    # integer (small attempts, a large pid, a late attempt's large progress)
    batch = [
        _started(str(uuid.uuid4()), attempt, pid)
        for attempt, pid in [(1, 7), (2, 40_000), (3, 4_000_000), (300, 7), (1, 2**31 - 1)]
    ]
    connection.ensure_connection()
    before = _upsert_executions()
    # When the ledger writes it, and then the same kind of batch again
    write(batch)
    write([_started(str(uuid.uuid4()), 1, 12) for _ in range(3)])
    # Then one statement was prepared on the server and ran once per job: the
    # values were bound there, in one set of types, never sent as query text
    assert list(_ran(before, _upsert_executions()).values()) == [len(batch) + 3]
    assert Job.objects.filter(state=states.RUNNING).count() == len(batch) + 3


def test_the_prepared_upsert_keeps_each_jobs_own_values() -> None:
    # Given two jobs started, then one finished with large values
    started = [_started(str(uuid.uuid4()), 1, 1234) for _ in range(2)]
    write(started)
    done = Event(
        started[0].message_id,
        states.SUCCEEDED,
        TERMINAL,
        _create(),
        {"finished_at": datetime.now(UTC), "duration_ms": 3_000_000_000 // 2},
    )
    # When it goes in one batch with the other's start sent again
    write([done, started[1]])
    # Then each row has its own: the finished one forward, the other unchanged
    first, second = (Job.objects.get(message_id=e.message_id) for e in started)
    assert (first.state, first.progress, first.duration_ms) == (
        states.SUCCEEDED,
        TERMINAL,
        1_500_000_000,
    )
    assert (second.state, second.attempts, second.worker_pid) == (states.RUNNING, 1, 1234)
    assert second.args == [1, "x"]


def test_it_prepares_nothing_when_told_not_to(settings: Any) -> None:
    # Given a deployment behind a pooler that cannot keep prepared statements
    settings.JOBS_LEDGER_PREPARED = False
    connection.ensure_connection()
    before = _upsert_executions()
    # When the ledger writes a batch
    write([_started(str(uuid.uuid4()), 1, os.getpid()) for _ in range(3)])
    # Then no prepared statement ran, and the jobs are recorded all the same
    assert _ran(before, _upsert_executions()) == {}
    assert Job.objects.count() == 3


def _finished(message_id: str, return_value: Any) -> Event:
    return Event(
        message_id,
        states.SUCCEEDED,
        TERMINAL,
        _create(),
        {"finished_at": datetime.now(UTC), "duration_ms": 1, "return_value": return_value},
    )


def test_one_prepared_upsert_takes_every_kind_of_return_value() -> None:
    # Given jobs (Django tasks keep their return value) returning a dict, and
    # then each kind of JSON scalar, each in a batch of its own
    connection.ensure_connection()
    before = _upsert_executions()
    values: list[Any] = [{"a": 1}, [1], 5, "text", True, 2.5, float("nan"), None]
    # When the ledger writes them
    for value in values:
        write([_finished(str(uuid.uuid4()), value)])
    # Then they all ran through one prepared statement (a scalar sent as
    # Django's Jsonb, a dict as text, would be a second one), stored as sent
    assert list(_ran(before, _upsert_executions()).values()) == [len(values)]
    stored = list(Job.objects.order_by("id").values_list("return_value", flat=True))
    assert stored == [{"a": 1}, [1], 5, "text", True, 2.5, "NaN", None]


def test_the_redelivery_check_is_never_prepared_whatever_the_connection_says() -> None:
    # Given a connection told to prepare every statement run twice (a
    # deployment's OPTIONS): a prepared plan made while the table is small
    # would scan it whole for good
    connection.ensure_connection()
    pg = connection.connection
    threshold, pg.prepare_threshold = pg.prepare_threshold, 2
    try:
        # When the writer checks a batch's starts for redeliveries five times
        for _ in range(5):
            write([_started(str(uuid.uuid4()), 1, 7)])
    finally:
        pg.prepare_threshold = threshold
    # Then its SELECT was never prepared (the upsert was, as always)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ['SELECT "message_id" FROM "jobs_job"%'],
        )
        assert cursor.fetchone() == (0,)
    assert Job.objects.count() == 5
