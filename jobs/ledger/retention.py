"""Retention of ledger rows, like BullMQ's removeOnFail / removeOnComplete.

Keeps the newest ``JOBS_KEEP_FAILED`` failed jobs and succeeded or skipped jobs
younger than ``JOBS_KEEP_SUCCEEDED_DAYS``; deletes the rest in primary-key
batches so a large backlog never loads into memory or holds one long lock.

The rows that only exist for a job go with the same horizon: outbox rows sent
before it (pending ones are never deleted: they still have to be sent), and
checkpoints older than it whose job is no longer kept in the ledger (pruned,
deleted, or being pruned now). Checkpoints of a job still in the ledger stay,
whatever their age: a waiting or running job may still resume from them, and the
admin shows them on a kept job's page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from jobs.ledger import states
from jobs.models import Job, JobCheckpoint, OutboxMessage

Progress = Callable[[str, int, int], None]  # (kind, done, total)


@dataclass(frozen=True)
class PrunePlan:
    failed: QuerySet[Job]
    finished: QuerySet[Job]
    outbox: QuerySet[OutboxMessage]
    checkpoints: QuerySet[JobCheckpoint]


def plan(*, keep_failed: int, keep_succeeded_days: int) -> PrunePlan:
    failed = Job.objects.filter(state=states.FAILED)
    cutoff = list(
        failed.order_by("-id").values_list("id", flat=True)[keep_failed : keep_failed + 1]
    )
    old_failed_q = Q(state=states.FAILED, id__lte=cutoff[0]) if cutoff else None
    horizon = timezone.now() - timedelta(days=keep_succeeded_days)
    ended = (states.SUCCEEDED, states.SKIPPED, states.CANCELLED)
    old_finished_q = Q(state__in=ended, finished_at__lt=horizon)
    pruned_q = old_finished_q | old_failed_q if old_failed_q is not None else old_finished_q
    # NOT EXISTS on the unique message_id: an anti-join, not a NOT IN list of every job.
    kept_job = Job.objects.filter(message_id=OuterRef("message_id")).exclude(pruned_q)
    return PrunePlan(
        failed=Job.objects.filter(old_failed_q) if old_failed_q is not None else failed.none(),
        finished=Job.objects.filter(old_finished_q),
        outbox=OutboxMessage.objects.filter(sent_at__lt=horizon),
        checkpoints=JobCheckpoint.objects.filter(created_at__lt=horizon).filter(~Exists(kept_job)),
    )


def _delete_in_batches(queryset: QuerySet[Any], kind: str, batch: int, progress: Progress) -> int:
    total = queryset.count()
    done = 0
    while True:
        ids = list(queryset.order_by("pk").values_list("pk", flat=True)[:batch])
        if not ids:
            break
        queryset.model._default_manager.filter(pk__in=ids).delete()
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
    kinds: dict[str, QuerySet[Any]] = {
        "failed": todo.failed,
        "succeeded/skipped/cancelled": todo.finished,
        "sent outbox": todo.outbox,
        "checkpoints": todo.checkpoints,
    }
    if dry_run:
        return {kind: queryset.count() for kind, queryset in kinds.items()}
    return {
        kind: _delete_in_batches(queryset, kind, batch, progress)
        for kind, queryset in kinds.items()
    }
