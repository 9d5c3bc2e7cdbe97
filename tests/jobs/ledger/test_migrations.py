"""Data migrations: what an existing ledger looks like after the upgrade."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
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
