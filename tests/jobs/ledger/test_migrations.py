"""Data migrations: what an existing ledger looks like after the upgrade."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.state import StateApps
from django.utils import timezone

from jobs.models import Job, JobReference

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ledger_before_retried_as() -> Iterator[StateApps]:
    """The database at the migration before ``retried_as``; the latest again after."""
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("jobs")
    executor.migrate([("jobs", "0005_effect_holder")])
    yield executor.loader.project_state([("jobs", "0005_effect_holder")]).apps
    MigrationExecutor(connection).migrate(latest)


def test_it_marks_jobs_retried_before_the_upgrade_as_retried(
    ledger_before_retried_as: StateApps,
) -> None:
    OldJob = ledger_before_retried_as.get_model("jobs", "Job")
    now = timezone.now()
    for message_id, state, retry_of in [
        ("retried", "failed", None),
        ("the-retry", "succeeded", "retried"),
        ("never-retried", "failed", None),
    ]:
        OldJob.objects.create(
            message_id=message_id,
            actor_name="a",
            queue_name="q",
            state=state,
            enqueued_at=now,
            retry_of_id=retry_of,
        )

    MigrationExecutor(connection).migrate([("jobs", "0006_job_retried_as")])

    retried_as = dict(Job.objects.values_list("message_id", "retried_as"))
    assert retried_as == {"retried": "the-retry", "the-retry": None, "never-retried": None}


@pytest.fixture
def ledger_with_subject_column() -> Iterator[StateApps]:
    """The database before JobReference (one ``Job.subject``); the latest again after."""
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("jobs")
    before = [("jobs", "0008_dashboard_indexes_and_subject")]
    executor.migrate(before)
    yield executor.loader.project_state(before).apps
    MigrationExecutor(connection).migrate(latest)


def test_it_keeps_the_subjects_of_existing_jobs_as_their_references(
    ledger_with_subject_column: StateApps,
) -> None:
    OldJob = ledger_with_subject_column.get_model("jobs", "Job")
    now = timezone.now()
    for message_id, subject in [("names-ada", "auth.user:7"), ("names-nothing", "")]:
        OldJob.objects.create(
            message_id=message_id, actor_name="a", queue_name="q", enqueued_at=now, subject=subject
        )

    MigrationExecutor(connection).migrate([("jobs", "0009_job_references")])
    references = list(JobReference.objects.values_list("job__message_id", "subject"))
    assert references == [("names-ada", "auth.user:7")]

    # and back: the job's first reference is its subject again
    MigrationExecutor(connection).migrate([("jobs", "0008_dashboard_indexes_and_subject")])
    subjects = dict(OldJob.objects.values_list("message_id", "subject"))
    assert subjects == {"names-ada": "auth.user:7", "names-nothing": ""}


def _job_indexes() -> dict[str, list[str]]:
    """Index name -> its columns, for every index (unique ones too) of ``jobs_job``."""
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, "jobs_job")
    return {
        name: info["columns"]
        for name, info in constraints.items()
        if info["index"] or info["unique"]
    }


def _pattern_indexes() -> list[str]:
    """Indexes of ``jobs_job`` that serve only ``LIKE 'prefix%'`` (PostgreSQL's
    ``varchar_pattern_ops``; Django names them ``..._like``)."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'jobs_job' "
            "AND indexdef LIKE '%%varchar_pattern_ops%%'"
        )
        return sorted(row[0] for row in cursor.fetchall())


def test_the_ledger_writes_no_index_that_no_query_uses() -> None:
    # Every job's insert writes every index of jobs_job; the pattern indexes
    # Django adds on PostgreSQL serve no query of the ledger
    assert _pattern_indexes() == []
    # while the exact-match ones stay (admin filters, retry chains, uniqueness)
    columns = [tuple(cols) for cols in _job_indexes().values()]
    for column in ("message_id", "actor_name", "queue_name", "retry_of_id"):
        assert (column,) in columns, column


def test_the_pattern_indexes_come_back_when_the_migration_is_reversed() -> None:
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("jobs")
    executor.migrate([("jobs", "0009_job_references")])
    try:
        restored = _pattern_indexes()
    finally:
        MigrationExecutor(connection).migrate(latest)
    if connection.vendor == "postgresql":
        assert len(restored) == 4, restored
    else:  # SQLite has no pattern indexes to drop or restore
        assert restored == []
    assert _pattern_indexes() == []


def test_dropping_the_pattern_indexes_does_not_stall_the_ledger_behind_an_open_transaction() -> (
    None
):
    # A deploy migrates while workers write and someone's transaction has read
    # jobs_job. A plain DROP INDEX queues for an exclusive lock behind that
    # transaction, and every lookup of jobs_job queues behind the DROP.
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no pattern indexes: the migration does nothing there")
    import psycopg

    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("jobs")
    executor.migrate([("jobs", "0009_job_references")])
    assert len(_pattern_indexes()) == 4
    params = connection.get_connection_params()
    migrated = threading.Event()

    def migrate() -> None:
        try:
            MigrationExecutor(connections["default"]).migrate(latest)
        finally:
            connections["default"].close()
            migrated.set()

    with psycopg.connect(**params) as holder, psycopg.connect(**params, autocommit=True) as reader:
        holder.execute("SELECT count(*) FROM jobs_job")  # its transaction stays open
        threading.Thread(target=migrate, daemon=True).start()
        time.sleep(0.5)  # the migration is waiting for the open transaction
        reader.execute("SET statement_timeout = 2000")
        started = time.monotonic()
        try:
            reader.execute("SELECT id FROM jobs_job WHERE message_id = 'x'").fetchall()
            waited = time.monotonic() - started
        except psycopg.errors.QueryCanceled:
            waited = float("inf")  # still queued when its timeout cancelled it
        holder.rollback()  # the transaction ends: the migration can finish
    finished = migrated.wait(30)
    if _pattern_indexes():  # leave the database as the other tests expect it
        MigrationExecutor(connection).migrate(latest)
    assert finished
    assert _pattern_indexes() == []
    assert waited < 1.0, (
        f"a ledger lookup queued behind the migration ({waited:.1f} s; inf: cancelled at 2 s)"
    )
