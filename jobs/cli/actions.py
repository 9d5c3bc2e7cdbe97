"""``jobs retry`` and ``jobs cancel``: count, confirm, then act in batches.

The work itself is ``jobs.ledger.operations`` (what the admin's actions call);
this module feeds it one batch of ids at a time so a long run reports progress,
says how far it got when stopped (Ctrl-C, Redis or the database failing), and
acts only on the jobs that were counted and confirmed: a job sent after the
count has a higher id and is left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import django.db
import redis
from django.db.models import Max, QuerySet

from jobs.cli.console import Console, operator
from jobs.cli.failed import permanent_paths
from jobs.cli.selection import Selection
from jobs.ledger import operations, states
from jobs.ledger.operations import Outcome
from jobs.models import Job

RETRY, CANCEL = "retry", "cancel"
STATES = {RETRY: (states.FAILED,), CANCEL: (states.ENQUEUED, states.DELAYED, states.RUNNING)}
NOUN = {RETRY: "failed job(s)", CANCEL: "waiting or running job(s)"}


_ACT: dict[str, Callable[[QuerySet[Job]], Outcome]] = {
    RETRY: operations.retry_jobs,
    # Who cancelled, as the ledger records it: the account running the command.
    CANCEL: lambda queryset: operations.cancel_jobs(queryset, by=f"{operator()} (manage.py jobs)"),
}


@dataclass
class Run:
    action: str
    selection: Selection
    dry_run: bool = False
    matched: int = 0
    done: int = 0
    already_retried: int = 0
    not_retriable: int = 0  # message gone from Redis and arguments redacted, or actor gone
    redis_away: int = 0  # retry: not tried, Redis not answering (its message there unread)
    permanent: int = 0  # failed for good, left alone without --include-permanent
    permanent_errors: list[str] = field(default_factory=list)
    requested: int = 0  # cancel: running jobs asked to stop
    already_requested: int = 0  # cancel: running jobs asked to stop before
    started: int = 0  # cancel: counted while not ended, ended by the time it acted
    not_found: list[str] = field(default_factory=list)
    other_state: dict[str, str] = field(default_factory=dict)
    declined: bool = False
    interrupted: bool = False
    error: str | None = None  # Redis or the database failed mid-run: the rest not done

    @property
    def complete(self) -> bool:
        """Everything asked for was done (or, in a dry run, would be tried)."""
        asked_well = self.matched > 0 and not self.not_found and not self.other_state
        if self.dry_run:
            return asked_well
        stopped = self.interrupted or self.error
        # A running job asked to stop (now or before) counts as done: the
        # worker ends it (jobs.runtime.cancellation).
        acted = self.done + self.requested + self.already_requested
        return asked_well and acted == self.matched and not stopped

    @property
    def outcome(self) -> str:
        """For the audit line."""
        if self.dry_run:
            return "dry run"
        if self.declined:
            return "declined"
        if self.error:
            return "stopped by an error"
        return "interrupted" if self.interrupted else "done"

    def add(self, outcome: Outcome) -> None:
        self.done += outcome.done
        if self.action == RETRY:
            self.already_retried += outcome.already
        else:
            self.already_requested += outcome.already
        self.not_retriable += outcome.skipped
        self.redis_away += outcome.unreachable
        self.requested += outcome.requested

    def document(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "action": self.action,
            "dry_run": self.dry_run,
            "selection": self.selection.describe(),
            "matched": self.matched,
            "done": self.done,
        }
        if self.action == RETRY:
            document |= {
                "already_retried": self.already_retried,
                "not_retriable": self.not_retriable,
                "redis_not_answering": self.redis_away,
                "permanent_skipped": self.permanent,
                "permanent_errors": self.permanent_errors,
            }
        else:
            document["requested_running"] = self.requested
            document["already_requested"] = self.already_requested
            document["started_meanwhile"] = self.started
        return document | {
            "not_found": self.not_found,
            "other_state": self.other_state,
            "declined": self.declined,
            "interrupted": self.interrupted,
            "error": self.error,
        }

    def text(self) -> str:
        noun = NOUN[self.action]
        verb = {RETRY: "Retried", CANCEL: "Cancelled"}[self.action]
        if not self.matched:
            lines = [f"Nothing to {self.action}: no {noun} match {self.selection}."]
        elif self.dry_run:
            lines = [f"{self.matched:,} {noun} match {self.selection} (dry run: nothing done)."]
        elif self.declined:
            lines = [f"Nothing done: {self.matched:,} {noun} match {self.selection}."]
        else:
            lines = [f"{verb} {self.done:,} of {self.matched:,} {noun} matching {self.selection}."]
        if self.already_retried:
            lines.append(
                f"{self.already_retried:,} were retried before (see 'retried as'): not sent again."
            )
        if self.not_retriable:
            lines.append(
                f"{self.not_retriable:,} could not be retried: their message left the "
                "dead-letter set and their stored arguments were redacted, or the actor is gone "
                "(or it is the admin's bulk action: start it again from the admin)."
            )
        if self.redis_away:
            lines.append(
                f"{self.redis_away:,} not retried: Redis is not answering, and their failed "
                "message is kept there. Run this again once Redis is back."
            )
        if self.permanent:
            lines.append(
                f"{self.permanent:,} failed for good ({', '.join(self.permanent_errors)}) and "
                "would fail again: left alone; --include-permanent retries them too."
            )
        if self.requested:
            lines.append(
                f"{self.requested:,} were running: asked to stop (within JOBS_CANCEL_GRACE_MS, "
                "by force if they do not check); 'jobs status' shows them end."
            )
        if self.already_requested:
            lines.append(
                f"{self.already_requested:,} running job(s) were already asked to stop: "
                "not asked again."
            )
        if self.started:
            lines.append(f"{self.started:,} ended before the cancel reached them (too late).")
        if self.interrupted:
            lines.append("Interrupted before the end: run it again for the rest.")
        if self.error:
            lines.append(f"Stopped by an error, the rest not done (run it again): {self.error}")
        if self.not_found:
            lines.append(f"No job has id(s): {', '.join(self.not_found)}")
        if self.other_state:
            wanted = " or ".join(STATES[self.action])
            others = ", ".join(f"{i} ({s})" for i, s in self.other_state.items())
            lines.append(f"Not {wanted}, left alone: {others}")
        return "\n".join(lines)


def _id_batches(queryset: QuerySet[Job], size: int) -> Iterator[list[int]]:
    """Ids of ``queryset`` in ascending batches: the primary key walks, no OFFSET."""
    ids = queryset.order_by("id").values_list("id", flat=True)
    last = 0
    while batch := list(ids.filter(id__gt=last)[:size]):
        yield batch
        last = batch[-1]


def plan(
    action: str, selection: Selection, *, include_permanent: bool, dry_run: bool
) -> tuple[Run, QuerySet[Job]]:
    """What ``action`` would act on: the counts, and the queryset to walk."""
    run = Run(action, selection, dry_run=dry_run)
    run.not_found, run.other_state = selection.left_out(STATES[action])
    queryset = selection.jobs(STATES[action])
    ceiling = queryset.aggregate(top=Max("id"))["top"]
    if ceiling is None:
        return run, queryset.none()
    queryset = queryset.filter(id__lte=ceiling)
    run.matched = queryset.count()
    if action == RETRY and not include_permanent:
        paths = permanent_paths(queryset)
        if paths:
            run.permanent = queryset.filter(error_class_path__in=paths).count()
            queryset = queryset.exclude(error_class_path__in=paths)
        run.permanent_errors = [path.rpartition(".")[2] for path in paths]
    if action == RETRY and dry_run:
        # A real run learns this from operations.retry_jobs, job by job.
        run.already_retried = queryset.exclude(retried_as=None).count()
    return run, queryset


def _progress(run: Run, processed: int, total: int) -> str:
    if run.action == RETRY:
        detail = (
            f"retried {run.done:,}, already retried {run.already_retried:,}, "
            f"not retriable {run.not_retriable:,}"
        )
    else:
        detail = f"cancelled {run.done:,}, asked to stop {run.requested:,}"
    return f"{run.action}: {processed:,}/{total:,} ({processed / total:.0%}): {detail}"


def perform(run: Run, queryset: QuerySet[Job], console: Console, *, batch: int) -> None:
    """Act on ``queryset`` batch by batch, with a progress line after each when
    there are several.

    Stopping early (Ctrl-C, Redis or the database failing) keeps what was done
    and says how much: each job is retried or cancelled, or not, on its own (a
    retry is claimed before it is sent, and released if the send fails), so
    running the command again does the rest. The counts of the batch under way
    are lost.
    """
    total = run.matched - run.permanent
    processed = 0
    act = _ACT[run.action]
    try:
        for ids in _id_batches(queryset, batch):
            run.add(act(Job.objects.filter(id__in=ids)))
            processed += len(ids)
            if total > batch:
                console.note(_progress(run, processed, total))
    except KeyboardInterrupt:
        run.interrupted = True
    except redis.RedisError as exc:
        run.error = f"Redis unreachable: {exc}"
    except django.db.Error as exc:
        run.error = f"database error: {exc}"
    else:
        if run.action == CANCEL:
            # Counted while waiting, not cancelled: a worker took them since
            # (the walk no longer finds them, or cancel_jobs' conditional update
            # skipped them).
            run.started = total - run.done - run.requested - run.already_requested
