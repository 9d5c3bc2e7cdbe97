from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from jobs.models import Job, JobCheckpoint, OutboxMessage
from jobs.tasks import prune_jobs

pytestmark = pytest.mark.django_db


def make_jobs(state: str, count: int, *, age: timedelta = timedelta(0)) -> None:
    now = timezone.now() - age
    Job.objects.bulk_create(
        Job(
            message_id=f"{state}-{age.days}-{n}",
            actor_name="a",
            queue_name="q",
            state=state,
            enqueued_at=now,
            finished_at=now,
        )
        for n in range(count)
    )


def prunejobs(*args: str) -> str:
    out = StringIO()
    call_command("prunejobs", *args, stdout=out)
    return out.getvalue()


def test_it_keeps_exactly_the_configured_number_of_newest_failed_jobs() -> None:
    make_jobs("failed", 25)
    newest = list(Job.objects.order_by("-id").values_list("id", flat=True)[:10])

    output = prunejobs("--keep-failed", "10", "--batch", "4")

    assert sorted(Job.objects.values_list("id", flat=True), reverse=True) == newest
    assert "failed: deleted 4/15" in output
    assert "failed: deleted 15/15" in output


def test_it_deletes_succeeded_jobs_older_than_the_horizon() -> None:
    make_jobs("succeeded", 5, age=timedelta(days=8))
    make_jobs("skipped", 2, age=timedelta(days=9))
    make_jobs("cancelled", 2, age=timedelta(days=9))  # ended too: pruned like a success
    make_jobs("succeeded", 3, age=timedelta(days=1))
    make_jobs("running", 2, age=timedelta(days=30))

    prunejobs("--keep-days", "7")

    assert (
        sorted(Job.objects.values_list("state", flat=True)) == ["running"] * 2 + ["succeeded"] * 3
    )


def test_dry_run_counts_and_deletes_nothing() -> None:
    make_jobs("failed", 12)

    output = prunejobs("--keep-failed", "2", "--dry-run")

    assert "would delete: 10 failed" in output
    assert Job.objects.count() == 12


def outbox_row(name: str, *, created_days_ago: int, sent_days_ago: int | None) -> None:
    now = timezone.now()
    row = OutboxMessage.objects.create(message_id=name, actor_name="a", queue_name="q", payload={})
    sent_at = None if sent_days_ago is None else now - timedelta(days=sent_days_ago)
    # created_at is auto_now_add: backdate it with an update.
    OutboxMessage.objects.filter(pk=row.pk).update(
        created_at=now - timedelta(days=created_days_ago), sent_at=sent_at
    )


def checkpoint(message_id: str, *, days_ago: int) -> None:
    row = JobCheckpoint.objects.create(message_id=message_id, step="1")
    JobCheckpoint.objects.filter(pk=row.pk).update(
        created_at=timezone.now() - timedelta(days=days_ago)
    )


def job(message_id: str, state: str, *, days_ago: int) -> None:
    at = timezone.now() - timedelta(days=days_ago)
    finished = state in ("succeeded", "skipped", "failed")
    Job.objects.create(
        message_id=message_id,
        actor_name="a",
        queue_name="q",
        state=state,
        enqueued_at=at,
        started_at=at,
        finished_at=at if finished else None,
    )


def test_it_deletes_sent_outbox_rows_older_than_the_horizon_and_never_pending_ones() -> None:
    outbox_row("sent-long-ago", created_days_ago=9, sent_days_ago=8)
    outbox_row("sent-yesterday", created_days_ago=9, sent_days_ago=1)
    outbox_row("never-sent", created_days_ago=30, sent_days_ago=None)

    output = prunejobs("--keep-days", "7")

    assert sorted(OutboxMessage.objects.values_list("message_id", flat=True)) == [
        "never-sent",
        "sent-yesterday",
    ]
    assert "1 sent outbox" in output


def test_it_deletes_old_checkpoints_of_jobs_it_does_not_keep() -> None:
    job("old-success", "succeeded", days_ago=8)  # pruned now
    checkpoint("old-success", days_ago=8)
    checkpoint("pruned-before", days_ago=10)  # its job row was pruned by an earlier run
    job("long-running", "running", days_ago=30)  # may still resume from its steps
    checkpoint("long-running", days_ago=30)
    job("kept-failure", "failed", days_ago=20)  # within --keep-failed: shown in the admin
    checkpoint("kept-failure", days_ago=20)
    job("recent-success", "succeeded", days_ago=1)
    checkpoint("recent-success", days_ago=1)
    checkpoint("not-in-ledger-yet", days_ago=0)  # its "enqueued" row may still be in a batch

    output = prunejobs("--keep-days", "7", "--keep-failed", "5")

    assert sorted(JobCheckpoint.objects.values_list("message_id", flat=True)) == [
        "kept-failure",
        "long-running",
        "not-in-ledger-yet",
        "recent-success",
    ]
    assert "2 checkpoints" in output


def test_dry_run_counts_the_checkpoints_of_jobs_it_would_prune() -> None:
    job("old-success", "succeeded", days_ago=8)
    checkpoint("old-success", days_ago=8)

    output = prunejobs("--keep-days", "7", "--dry-run")

    assert "1 succeeded/skipped/cancelled, 0 sent outbox, 1 checkpoints" in output
    assert JobCheckpoint.objects.count() == 1


def test_the_periodic_prune_job_prunes_outbox_rows_and_checkpoints_too(settings) -> None:
    settings.JOBS_KEEP_SUCCEEDED_DAYS = 7  # the shipped default, whatever the environment says
    outbox_row("sent-long-ago", created_days_ago=9, sent_days_ago=8)
    checkpoint("pruned-before", days_ago=10)

    prune_jobs()  # the actor's function, as the worker runs it at 03:30

    assert not OutboxMessage.objects.exists()
    assert not JobCheckpoint.objects.exists()
