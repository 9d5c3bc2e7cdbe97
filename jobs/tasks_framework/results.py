"""Task results read from the job ledger (``jobs.Job`` and its ``JobAttempt`` rows).

The result id is the Dramatiq message id. Ledger states map to the framework's:
enqueued/delayed (waiting, or backing off before a retry) -> READY, running ->
RUNNING, succeeded -> SUCCESSFUL, failed/skipped -> FAILED. A message still in
the outbox (its transaction committed, the broker not reached yet) is READY.

An operator's retry of a failed task (admin "retry", ``Job.retried_as``) goes
on with the same task under a new message id. A result id follows that chain:
it reads as its latest retry does (status, end, return value), with every
attempt of the chain in ``errors`` and ``worker_ids``, so whoever holds the id
``enqueue()`` gave sees the task the operator finished. A retry's own id reads
the chain from that retry on.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import dramatiq
from django.utils.module_loading import import_string
from dramatiq.common import q_name

from jobs.ledger import states
from jobs.tasks_framework.compat import (
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
)

if TYPE_CHECKING:
    from jobs.models import Job, JobAttempt

# Operator retries followed from one id: far more than anyone clicks, and a
# bound should a corrupted ledger ever link jobs in a loop.
MAX_RETRY_CHAIN = 100

STATUS = {
    states.ENQUEUED: TaskResultStatus.READY,
    states.DELAYED: TaskResultStatus.READY,
    states.RUNNING: TaskResultStatus.RUNNING,
    states.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    states.FAILED: TaskResultStatus.FAILED,
    states.SKIPPED: TaskResultStatus.FAILED,
    # Django's Tasks API has no "cancelled" status: a failure whose error says so.
    states.CANCELLED: TaskResultStatus.FAILED,
}


class TaskSkipped(Exception):
    """Stands for a skip (cancelled in the admin, too old) in a result's errors."""


def from_millis(millis: float) -> datetime:
    return datetime.fromtimestamp(millis / 1000, UTC)


def worker_id(host: str, pid: int | None) -> str:
    return f"{host}:{pid}" if host else "unknown"


def task_of(actor_name: str, queue_name: str) -> Task[Any, Any]:
    """The module-level Task an actor name (its module path) refers to."""
    try:
        task = import_string(actor_name)
    except ImportError:
        raise TaskResultDoesNotExist(f"{actor_name!r} is not a task") from None
    if not isinstance(task, Task):
        raise TaskResultDoesNotExist(f"{actor_name!r} is not a task")
    return task if task.queue_name == queue_name else task.using(queue_name=queue_name)


def error_of(attempt: JobAttempt | Job) -> TaskError:
    path = attempt.error_class_path or f"builtins.{attempt.error_type or 'Exception'}"
    return TaskError(exception_class_path=path, traceback=attempt.traceback)


def _build(
    task: Task[Any, Any], backend: str, message_id: str, **fields: Any
) -> TaskResult[Any, Any]:
    return_value = fields.pop("return_value", None)
    result: TaskResult[Any, Any] = TaskResult(task=task, id=message_id, backend=backend, **fields)
    # Frozen dataclass: the framework's own backends set it the same way.
    object.__setattr__(result, "_return_value", return_value)
    return result


def _waiting(message: dramatiq.Message[Any], backend: str) -> TaskResult[Any, Any]:
    # A task sent with run_after waits in the delay queue ("<queue>.DQ").
    return _build(
        task_of(message.actor_name, q_name(message.queue_name)),
        backend,
        message.message_id,
        status=TaskResultStatus.READY,
        enqueued_at=from_millis(message.message_timestamp),
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=list(message.args),
        kwargs=dict(message.kwargs),
        errors=[],
        worker_ids=[],
    )


def _from_outbox(message_id: str, backend: str) -> TaskResult[Any, Any]:
    from jobs.models import OutboxMessage

    row = OutboxMessage.objects.filter(message_id=message_id).first()
    if row is None:
        raise TaskResultDoesNotExist(message_id)
    return _build(
        task_of(row.actor_name, row.queue_name),
        backend,
        message_id,
        status=TaskResultStatus.READY,
        enqueued_at=row.created_at,
        started_at=None,
        finished_at=None,
        last_attempted_at=None,
        args=list(row.payload.get("args", [])),
        kwargs=dict(row.payload.get("kwargs", {})),
        errors=[],
        worker_ids=[],
    )


def retry_chain(message_id: str) -> list[Job]:
    """The job ``message_id`` and the retries an operator sent for it, oldest first.

    Ends at the newest retry the ledger has a row for ([] for an unknown id): a
    retry is claimed on the failed row just before it is sent, so its own row
    may not be written yet.
    """
    from jobs.models import Job

    chain: list[Job] = []
    next_id: str | None = message_id
    while next_id and len(chain) < MAX_RETRY_CHAIN:
        job = Job.objects.filter(message_id=next_id).first()
        if job is None or any(j.message_id == job.message_id for j in chain):
            break
        chain.append(job)
        next_id = job.retried_as
    return chain


def retry_origins(message_id: str) -> list[str]:
    """``message_id`` and the ids it retries (``Job.retry_of``), newest first."""
    from jobs.models import Job

    ids = [message_id]
    while len(ids) < MAX_RETRY_CHAIN:
        retry_of = Job.objects.filter(message_id=ids[-1]).values_list("retry_of_id", flat=True)
        # A message id (to_field): the stubs type every foreign key column as int.
        parent = str(retry_of.first() or "")
        if not parent or parent in ids:
            break
        ids.append(parent)
    return ids


def _attempts(job: Job) -> tuple[list[str], list[TaskError], list[datetime]]:
    """Worker ids, errors and start times of one job's attempts."""
    from jobs.models import JobAttempt

    failures = list(JobAttempt.objects.filter(job_id=job.message_id).order_by("number"))
    worker_ids = [worker_id(f.worker_host, f.worker_pid) for f in failures]
    errors = [error_of(f) for f in failures]
    if job.attempts > len(failures) and job.started_at is not None:
        worker_ids.append(worker_id(job.worker_host, job.worker_pid))  # the last attempt
    if job.state == states.CANCELLED and job.started_at is None:
        path = f"{TaskSkipped.__module__}.{TaskSkipped.__qualname__}"
        errors.append(TaskError(exception_class_path=path, traceback="Cancelled before it ran"))
    elif job.state == states.CANCELLED:
        errors.append(
            TaskError(
                exception_class_path=job.error_class_path or "jobs.errors.JobCancelled",
                traceback=job.traceback or "Cancelled while running",
            )
        )
    if job.state == states.SKIPPED:
        reason = job.skip_reason or "skipped"
        path = f"{TaskSkipped.__module__}.{TaskSkipped.__qualname__}"
        errors.append(TaskError(exception_class_path=path, traceback=f"Skipped: {reason}"))
    starts: list[datetime] = [f.started_at for f in failures if f.started_at is not None]
    if job.started_at is not None:
        starts.append(job.started_at)
    return worker_ids, errors, starts


def result_read(message_id: str, *, backend: str) -> TaskResult[Any, Any]:
    """The task result ``message_id`` as the ledger knows it now, retries included."""
    # Models are imported in the functions: backends are built (and this module
    # loaded) while task modules are imported, possibly before the app
    # registry is ready.
    from jobs.ledger import intake

    chain = retry_chain(message_id)
    if not chain:
        # Sent moments ago: its row may still be in the ledger's Redis intake.
        if intake.catch_up():
            chain = retry_chain(message_id)
        elif (waiting := intake.peek(message_id)) is not None:
            # Not drained now (the reader is inside a transaction, or another
            # process is draining): the intake's copy says it waits.
            return _waiting(waiting, backend)
    if not chain:
        return _from_outbox(message_id, backend)
    retry_pending = False
    if chain[-1].retried_as:
        # An operator's retry was sent; its row may still be in the intake.
        if intake.catch_up():
            chain = retry_chain(message_id)
        else:
            # Not drained now (another process is at it): the retry waits in
            # Redis. Not the failure before it, or a client polling until the
            # task ends would stop there. (Drained and still no row: the retry
            # was pruned or deleted, or never sent: the last row is the answer.)
            retry_pending = True
    first, last = chain[0], chain[-1]
    worker_ids: list[str] = []
    errors: list[TaskError] = []
    starts: list[datetime] = []
    for job in chain:
        ids, errs, times = _attempts(job)
        worker_ids += ids
        errors += errs
        starts += times
    return _build(
        task_of(first.actor_name, first.queue_name),
        backend,
        message_id,
        status=TaskResultStatus.READY if retry_pending else STATUS[last.state],
        enqueued_at=first.enqueued_at,
        started_at=min(starts, default=None),
        finished_at=last.finished_at if last.is_terminal and not retry_pending else None,
        last_attempted_at=max(starts, default=None),
        args=list(first.args),
        kwargs=dict(first.kwargs),
        errors=errors,
        worker_ids=worker_ids,
        return_value=last.return_value if last.state == states.SUCCEEDED else None,
    )
