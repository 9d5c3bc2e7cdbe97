from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from jobs.models import Job

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
