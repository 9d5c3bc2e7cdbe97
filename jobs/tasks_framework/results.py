"""Task results read from the job ledger (``jobs.Job`` and its ``JobAttempt`` rows).

The result id is the Dramatiq message id. Ledger states map to the framework's:
enqueued/delayed (waiting, or backing off before a retry) -> READY, running ->
RUNNING, succeeded -> SUCCESSFUL, failed/skipped -> FAILED. A message still in
the outbox (its transaction committed, the broker not reached yet) is READY.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

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

STATUS = {
    states.ENQUEUED: TaskResultStatus.READY,
    states.DELAYED: TaskResultStatus.READY,
    states.RUNNING: TaskResultStatus.RUNNING,
    states.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    states.FAILED: TaskResultStatus.FAILED,
    states.SKIPPED: TaskResultStatus.FAILED,
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


def result_read(message_id: str, *, backend: str) -> TaskResult[Any, Any]:
    """The task result ``message_id`` as the ledger knows it now."""
    # Imported here: backends are built (and this module loaded) while task
    # modules are imported, possibly before the app registry is ready.
    from jobs.models import Job, JobAttempt

    job = Job.objects.filter(message_id=message_id).first()
    if job is None:
        return _from_outbox(message_id, backend)
    task = task_of(job.actor_name, job.queue_name)
    failures = list(JobAttempt.objects.filter(job_id=message_id).order_by("number"))
    worker_ids = [worker_id(f.worker_host, f.worker_pid) for f in failures]
    errors = [error_of(f) for f in failures]
    if job.attempts > len(failures) and job.started_at is not None:
        worker_ids.append(worker_id(job.worker_host, job.worker_pid))  # the last attempt
    if job.state == states.SKIPPED:
        reason = job.skip_reason or "skipped"
        path = f"{TaskSkipped.__module__}.{TaskSkipped.__qualname__}"
        errors.append(TaskError(exception_class_path=path, traceback=f"Skipped: {reason}"))
    starts: list[datetime] = [f.started_at for f in failures if f.started_at is not None]
    if job.started_at is not None:
        starts.append(job.started_at)
    return _build(
        task,
        backend,
        message_id,
        status=STATUS[job.state],
        enqueued_at=job.enqueued_at,
        started_at=min(starts, default=None),
        finished_at=job.finished_at if job.is_terminal else None,
        last_attempted_at=job.started_at,
        args=list(job.args),
        kwargs=dict(job.kwargs),
        errors=errors,
        worker_ids=worker_ids,
        return_value=job.return_value if job.state == states.SUCCEEDED else None,
    )
