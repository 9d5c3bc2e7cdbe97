"""``DramatiqBackend``: Django's Tasks framework on the Dramatiq platform.

    TASKS = {
        "default": {
            "BACKEND": "jobs.tasks_framework.backend.DramatiqBackend",
            "QUEUES": ["default", "exports"],
            "OPTIONS": {"max_retries": 2, "min_backoff": 5000, "time_limit": 600_000},
        }
    }

``enqueue()`` inside a transaction writes the message to the outbox
(``message_send_on_commit``): it is published after the commit, or by the relay
if the broker is down then, and never for a rollback. Outside a transaction it
is sent at once. The result id is the Dramatiq message id; results come from the
job ledger (``results.py``).

Priority is refused (``supports_priority = False``): the Redis broker keeps one
FIFO list per queue, and Dramatiq's actor priority only orders the few messages
a worker has prefetched, so a task priority could not be honoured. Use a queue
of its own for urgent tasks.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import dramatiq
from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from dramatiq.actor import _queue_name_re

from jobs.broker import redis_broker
from jobs.consistency.outbox import message_send_on_commit
from jobs.observability import logcontext
from jobs.tasks_framework import results, runner
from jobs.tasks_framework.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)

# Dramatiq's actor options a backend (OPTIONS) or a task (``@task(max_retries=...)``)
# may set; milliseconds for times. Unset ones fall back to the middleware
# defaults (JOBS_MAX_RETRIES, JOBS_MIN_BACKOFF_MS, JOBS_MAX_BACKOFF_MS, JOBS_TIME_LIMIT_MS).
ACTOR_OPTIONS = ("max_retries", "min_backoff", "max_backoff", "time_limit", "max_age")
BACKEND_OPTIONS = (*ACTOR_OPTIONS, "result_max_bytes", "worker_queues")
# Checked when the task's actor is declared (jobs.concurrency.keys, .fairness).
TASK_ONLY_OPTIONS = ("concurrency_key", "concurrency_limit", "fairness_key")
DEFAULT_RESULT_MAX_BYTES = 64 * 1024
# Dramatiq's Redis broker holds delayed messages in the consuming worker until
# they are due, and documents delays up to 7 days.
MAX_DEFER = timedelta(days=7)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DramatiqTask(Task):  # type: ignore[type-arg]
    """A task with Dramatiq's per-actor options: ``@task(max_retries=5, time_limit=60_000)``."""

    max_retries: int | None = None
    min_backoff: int | None = None
    max_backoff: int | None = None
    time_limit: int | None = None
    max_age: int | None = None
    # Per-key concurrency (jobs.concurrency): a format string over the task's
    # arguments and the most jobs of one key that run at once. Per task only.
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    # Fair queueing (jobs.concurrency.fairness): jobs of each key take turns.
    fairness_key: str | None = None


def _option_problems(name: str, value: Any) -> list[str]:
    if name in ACTOR_OPTIONS or name == "result_max_bytes":
        if type(value) is not int or value < (0 if name == "max_retries" else 1):
            least = 0 if name == "max_retries" else 1
            return [f"OPTIONS[{name!r}] must be a whole number >= {least}, got {value!r}"]
        return []
    if name == "worker_queues":
        if value is None:
            return []
        if not isinstance(value, (list, tuple)) or not all(isinstance(q, str) for q in value):
            return [f"OPTIONS['worker_queues'] must be a list of queue names, got {value!r}"]
        return []
    return [f"OPTIONS has an unknown key {name!r} (known: {', '.join(BACKEND_OPTIONS)})"]


def _params_problems(params: dict[str, Any]) -> list[str]:
    problems: list[str] = []
    queues = params.get("QUEUES", ["default"])
    if not isinstance(queues, (list, tuple, set)) or not all(isinstance(q, str) for q in queues):
        problems.append(f"QUEUES must be a list of queue names, got {queues!r}")
    else:
        problems += [
            f"QUEUES has {q!r}, which is not a valid Dramatiq queue name"
            for q in queues
            if not _queue_name_re.fullmatch(q)
        ]
    options = params.get("OPTIONS", {})
    if not isinstance(options, dict):
        return [*problems, f"OPTIONS must be a dict, got {options!r}"]
    for name, value in options.items():
        problems += _option_problems(str(name), value)
    return problems


class DramatiqBackend(BaseTaskBackend):
    task_class = DramatiqTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        # Built when a task module is imported (and by ``manage.py check``): no
        # database or Redis access here, and nothing raised for a bad setting.
        # A bad value is left out and listed in ``problems``: check() reports
        # them (jobs.E101), enqueue() and the worker refuse to run on them.
        self.problems = _params_problems(params)
        queues_ok = not any(p.startswith("QUEUES ") for p in self.problems)
        # No QUEUES is "any queue" to the framework, so tasks still import.
        super().__init__(alias, params if queues_ok else {**params, "QUEUES": []})
        options = self.options if isinstance(self.options, dict) else {}
        valid = {k: v for k, v in options.items() if not _option_problems(str(k), v)}
        self.defaults = {k: valid[k] for k in ACTOR_OPTIONS if k in valid}
        self.result_max_bytes: int = valid.get("result_max_bytes", DEFAULT_RESULT_MAX_BYTES)
        self.worker_queues: list[str] | None = valid.get("worker_queues")

    def require_valid(self) -> None:
        """Raise ``ImproperlyConfigured`` naming every problem of this backend's TASKS entry."""
        if self.problems:
            raise ImproperlyConfigured(f"TASKS[{self.alias!r}]: {'; '.join(self.problems)}")

    def actor_options(self, task: Task[Any, Any]) -> dict[str, Any]:
        """The actor options of ``task``: its own, else the backend's OPTIONS."""
        own = {k: getattr(task, k, None) for k in (*ACTOR_OPTIONS, *TASK_ONLY_OPTIONS)}
        return {**self.defaults, **{k: v for k, v in own.items() if v is not None}}

    def validate_task(self, task: Task[Any, Any]) -> None:
        super().validate_task(task)
        for name in ACTOR_OPTIONS:
            value = getattr(task, name, None)
            if value is not None and _option_problems(name, value):
                raise InvalidTask(f"{name} must be a whole number, got {value!r}")
        runner.declare(self, task)

    def _delay_ms(self, task: Task[Any, Any]) -> int | None:
        if task.run_after is None:
            return None
        delay = task.run_after - timezone.now()
        if delay > MAX_DEFER:
            raise InvalidTask(f"run_after may be at most {MAX_DEFER.days} days ahead")
        millis = int(delay.total_seconds() * 1000)
        return millis if millis > 0 else None

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        self.require_valid()
        self.validate_task(task)
        actor = runner.declare(self, task)
        if actor is None:
            raise ImproperlyConfigured("Django tasks cannot be enqueued before Django is set up")
        delay = self._delay_ms(task)
        request_id = logcontext.current().get("request_id")
        message: dramatiq.Message[Any] = dramatiq.Message(
            queue_name=task.queue_name,
            actor_name=actor.actor_name,
            args=tuple(args),
            kwargs=dict(kwargs),
            options={"request_id": request_id} if request_id else {},
        )
        # Built before sending: it refuses arguments that are not JSON.
        result: TaskResult[Any, Any] = TaskResult(
            task=task,
            id=message.message_id,
            status=TaskResultStatus.READY,
            enqueued_at=results.from_millis(message.message_timestamp),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        if transaction.get_connection().in_atomic_block:
            message_send_on_commit(message, delay_ms=delay)
            transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result))
        else:
            # A get_result() right after finds it: the ledger's intake is read
            # for a task the ledger does not have yet (results.result_read).
            redis_broker().enqueue(message, delay=delay)
            task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        return results.result_read(result_id, backend=self.alias)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages: list[checks.CheckMessage] = [
            checks.Error(
                problem,
                hint="See docs/howto/django-tasks.md.",
                obj=f"TASKS[{self.alias!r}]",
                id="jobs.E101",
            )
            for problem in self.problems
        ]
        discovered = _autodiscovered_modules()
        for task in runner.declared_tasks():
            if task.backend != self.alias:
                continue
            if self.worker_queues is not None and task.queue_name not in self.worker_queues:
                messages.append(
                    checks.Warning(
                        f"Task {task.module_path!r} is sent to queue {task.queue_name!r}, "
                        "which no worker serves (OPTIONS['worker_queues']).",
                        hint="Start a worker with that queue, or move the task to a served one.",
                        obj=task.module_path,
                        id="jobs.W102",
                    )
                )
            if task.func.__module__ not in discovered:
                messages.append(
                    checks.Warning(
                        f"Task {task.module_path!r} is defined in {task.func.__module__!r}, "
                        "which rundramatiq does not import: no worker would know the task.",
                        hint="Define tasks in an installed app's tasks.py module.",
                        obj=task.module_path,
                        id="jobs.W103",
                    )
                )
        return messages


def _autodiscovered_modules() -> set[str]:
    """The modules ``rundramatiq`` imports in every worker (django_dramatiq's rule)."""
    names = getattr(settings, "DRAMATIQ_AUTODISCOVER_MODULES", ("tasks",))
    return {f"{app.name}.{name}" for app in apps.get_app_configs() for name in names}


def dramatiq_backend_of(task: Task[Any, Any]) -> DramatiqBackend | None:
    backend = task_backends[task.backend]
    return backend if isinstance(backend, DramatiqBackend) else None


def declare_pending_tasks() -> None:
    """Called once Django is set up: actors of tasks created before the broker was."""
    runner.declare_pending(dramatiq_backend_of)
