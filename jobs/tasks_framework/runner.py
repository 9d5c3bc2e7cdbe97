"""The Dramatiq actor behind each Django task, and what it does in the worker.

Each task is declared as one Dramatiq actor named by its module path
(``accounts.tasks.user_export``), so the admin, the ledger, metrics and logs
show it like any actor, and every middleware (time limit, retries, payload
checks, ledger, metrics, log context) applies to it. The actor is declared when
the task is created, i.e. when its module is imported: ``rundramatiq`` imports
every app's ``tasks`` module, so a task defined there needs no other setup.

In the worker, the actor sends ``task_started`` / ``task_finished``, passes a
``TaskContext`` with the attempt number to tasks that take one, and checks the
return value (JSON, size cap) before the ledger stores it.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import dramatiq
from django.utils import timezone
from dramatiq.middleware import CurrentMessage

from jobs.errors import PermanentJobError, is_permanent
from jobs.ledger.redaction import redact_text
from jobs.tasks_framework.compat import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from jobs.tasks_framework.results import error_of, from_millis, worker_id

if TYPE_CHECKING:
    from jobs.tasks_framework.backend import DramatiqBackend

HOST = socket.gethostname()
# Module path -> the task as first declared (the module-level one; ``using()``
# variants share its actor).
_tasks: dict[str, Task[Any, Any]] = {}


class InvalidReturnValue(PermanentJobError):
    """A task returned what cannot be stored as its result; running it again won't help."""


def _global_broker() -> dramatiq.Broker | None:
    # Before django_dramatiq's app is ready there is no broker yet, and asking
    # dramatiq.get_broker() then would build a default one of its own.
    broker: dramatiq.Broker | None = dramatiq.broker.global_broker
    return broker


def declare(backend: DramatiqBackend, task: Task[Any, Any]) -> dramatiq.Actor[Any, Any] | None:
    """The task's actor, declared on the broker now if needed (None before set-up)."""
    name = task.module_path
    _tasks.setdefault(name, task)
    broker = _global_broker()
    if broker is None:
        return None
    actor: dramatiq.Actor[Any, Any] | None = broker.actors.get(name)
    if actor is None:
        actor = dramatiq.Actor(
            _actor_function(_tasks[name]),
            broker=broker,
            actor_name=name,
            queue_name=_tasks[name].queue_name,
            priority=0,
            options={**backend.actor_options(_tasks[name]), "store_return_value": True},
        )
    # Workers consume the queues their broker knows: every queue a task of this
    # backend may be sent to, including those chosen with ``using()`` elsewhere.
    for queue_name in sorted(backend.queues | {task.queue_name}):
        broker.declare_queue(queue_name)
    return actor


def declare_pending(backend_of: Callable[[Task[Any, Any]], DramatiqBackend | None]) -> None:
    """Declare the actors of tasks created before the broker existed."""
    for task in list(_tasks.values()):
        backend = backend_of(task)
        if backend is not None:
            declare(backend, task)


def declared_tasks() -> list[Task[Any, Any]]:
    return list(_tasks.values())


def _actor_function(task: Task[Any, Any]) -> Callable[..., Any]:
    module_path = task.module_path

    def run_task(*args: Any, **kwargs: Any) -> Any:
        return execute(module_path, args, kwargs)

    signature = inspect.signature(task.func)
    if task.takes_context:  # the worker supplies it; messages never carry it
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    run_task.__name__ = task.name
    run_task.__qualname__ = task.func.__qualname__
    run_task.__module__ = task.func.__module__
    run_task.__wrapped__ = task.func  # type: ignore[attr-defined]
    run_task.__signature__ = signature  # type: ignore[attr-defined]
    return run_task


def _is_final(broker: dramatiq.Broker, message: dramatiq.Message[Any], exc: BaseException) -> bool:
    """Whether Retries will give up on this failure (the same rule it applies)."""
    if is_permanent(exc):
        return True
    actor = broker.get_actor(message.actor_name)
    default = next(
        (m.max_retries for m in broker.middleware if isinstance(m, dramatiq.middleware.Retries)),
        0,
    )
    max_retries = message.options.get("max_retries", actor.options.get("max_retries", default))
    return max_retries is not None and int(message.options.get("retries", 0)) >= max_retries


def task_error(exc: BaseException) -> TaskError:
    kind = type(exc)
    text = redact_text("".join(traceback.format_exception(exc)))
    return TaskError(exception_class_path=f"{kind.__module__}.{kind.__qualname__}", traceback=text)


def storable(module_path: str, value: Any, max_bytes: int) -> Any:
    """``value`` as JSON the ledger can keep, or ``InvalidReturnValue`` saying why not."""
    try:
        normalized = normalize_json(value)
        size = len(json.dumps(normalized, allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise InvalidReturnValue(
            f"{module_path} returned a {type(value).__name__}, which cannot be stored as a "
            f"task result ({exc}): return JSON values (dict, list, str, int, float, bool, None)"
        ) from None
    if size > max_bytes:
        raise InvalidReturnValue(
            f"{module_path} returned {size} bytes of JSON, over the {max_bytes}-byte cap "
            "(TASKS OPTIONS 'result_max_bytes'): store large results elsewhere and return a key"
        )
    return normalized


def _running_result(
    task: Task[Any, Any], message: dramatiq.Message[Any], args: tuple[Any, ...], kwargs: Any
) -> TaskResult[Any, Any]:
    from jobs.models import JobAttempt

    attempt = int(message.options.get("retries", 0)) + 1
    earlier = list(
        JobAttempt.objects.filter(job_id=message.message_id, number__lt=attempt).order_by("number")
    )
    worker_ids = [worker_id(a.worker_host, a.worker_pid) for a in earlier]
    # Attempts the ledger did not see (it may be off) still count.
    worker_ids += ["unknown"] * (attempt - 1 - len(worker_ids))
    now = timezone.now()
    first_start = min((a.started_at for a in earlier if a.started_at is not None), default=now)
    result: TaskResult[Any, Any] = TaskResult(
        task=task,
        id=message.message_id,
        status=TaskResultStatus.RUNNING,
        enqueued_at=from_millis(message.message_timestamp),
        started_at=first_start,
        finished_at=None,
        last_attempted_at=now,
        args=list(args),
        kwargs=dict(kwargs),
        backend=task.backend,
        errors=[error_of(a) for a in earlier],
        worker_ids=[*worker_ids, worker_id(HOST, os.getpid())],
    )
    return result


def _finish(result: TaskResult[Any, Any], status: TaskResultStatus, **changes: Any) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    for name, value in changes.items():
        object.__setattr__(result, name, value)


def execute(module_path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run one attempt of the task ``module_path`` for the current message."""
    from jobs.tasks_framework.backend import DramatiqBackend

    message = CurrentMessage.get_current_message()
    if message is None:
        raise RuntimeError("Django tasks run in a Dramatiq worker with CurrentMessage middleware")
    task = _tasks[module_path]
    if task.queue_name != message.queue_name.removesuffix(".DQ"):
        task = task.using(queue_name=message.queue_name.removesuffix(".DQ"))
    backend = task.get_backend()
    sender = type(backend)
    max_bytes = 65536
    if isinstance(backend, DramatiqBackend):
        backend.require_valid()  # a worker started on a bad TASKS setting runs nothing
        max_bytes = backend.result_max_bytes
    result = _running_result(task, message, args, kwargs)
    task_started.send(sender, task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        value = storable(module_path, value, max_bytes)
    except BaseException as exc:
        if _is_final(dramatiq.get_broker(), message, exc):
            _finish(result, TaskResultStatus.FAILED, errors=[*result.errors, task_error(exc)])
            task_finished.send(sender, task_result=result)
        raise
    _finish(result, TaskResultStatus.SUCCESSFUL, _return_value=value)
    task_finished.send(sender, task_result=result)
    return value
