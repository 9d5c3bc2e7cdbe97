"""Retention of ledger rows, like BullMQ's removeOnFail / removeOnComplete.

Keeps the newest ``JOBS_KEEP_FAILED`` failed jobs and succeeded or skipped jobs
younger than ``JOBS_KEEP_SUCCEEDED_DAYS``; deletes the rest in primary-key
batches so a large backlog never loads into memory or holds one long lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import QuerySet
from django.utils import timezone

from jobs.ledger import states
from jobs.models import Job

Progress = Callable[[str, int, int], None]  # (kind, done, total)


@dataclass(frozen=True)
class PrunePlan:
    failed: QuerySet[Job]
    finished: QuerySet[Job]


def plan(*, keep_failed: int, keep_succeeded_days: int) -> PrunePlan:
    failed = Job.objects.filter(state=states.FAILED)
    cutoff = list(
        failed.order_by("-id").values_list("id", flat=True)[keep_failed : keep_failed + 1]
    )
    old_failed = failed.filter(id__lte=cutoff[0]) if cutoff else failed.none()
    horizon = timezone.now() - timedelta(days=keep_succeeded_days)
    old_finished = Job.objects.filter(
        state__in=(states.SUCCEEDED, states.SKIPPED), finished_at__lt=horizon
    )
    return PrunePlan(failed=old_failed, finished=old_finished)


def _delete_in_batches(queryset: QuerySet[Job], kind: str, batch: int, progress: Progress) -> int:
    total = queryset.count()
    done = 0
    while True:
        ids = list(queryset.order_by("id").values_list("id", flat=True)[:batch])
        if not ids:
            break
        Job.objects.filter(id__in=ids).delete()
        done += len(ids)
        progress(kind, done, total)
    return done


def prune(
    *,
    keep_failed: int,
    keep_succeeded_days: int,
    batch: int = 1000,
    dry_run: bool = False,
    progress: Progress = lambda kind, done, total: None,
) -> dict[str, int]:
    """Delete what retention does not keep; return how many rows per kind."""
    todo = plan(keep_failed=keep_failed, keep_succeeded_days=keep_succeeded_days)
    if dry_run:
        return {"failed": todo.failed.count(), "succeeded/skipped": todo.finished.count()}
    return {
        "failed": _delete_in_batches(todo.failed, "failed", batch, progress),
        "succeeded/skipped": _delete_in_batches(
            todo.finished, "succeeded/skipped", batch, progress
        ),
    }
