"""Django tasks on the Dramatiq platform: real Redis, a real in-process worker."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

import dramatiq
import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client
from django.utils import timezone

from jobs.broker import redis_broker
from jobs.errors import PermanentJobError
from jobs.ledger import operations
from jobs.ledger import writer as ledger
from jobs.models import Job, OutboxMessage
from jobs.tasks_framework.backend import DramatiqBackend
from jobs.tasks_framework.compat import (
    InvalidTask,
    TaskContext,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task,
    task_enqueued,
    task_finished,
    task_started,
)
from tests.conftest import IDLE_POLL_MS, join, queued_messages

pytestmark = pytest.mark.django_db(transaction=True)
T = TypeVar("T")
calls: Counter[str] = Counter()


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def flaky(key: str) -> str:
    calls[key] += 1
    if calls[key] == 1:
        raise ConnectionError("the network blinked")
    return f"done after {calls[key]}"


@task
def broken(note: str) -> None:
    raise PermanentJobError(f"cannot handle {note}; password=hunter2")


@task
async def add_later(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a + b


@task(takes_context=True)
def which_attempt(context: TaskContext[Any, Any], key: str) -> dict[str, Any]:
    calls[key] += 1
    if context.attempt == 1:
        raise ConnectionError("first attempt fails")
    return {"attempt": context.attempt, "id": context.task_result.id}


@task(takes_context=True)
def with_context_and_a_key(context: TaskContext[Any, Any], user_id: int, api_key: str) -> None:
    pass


@task
def returns_a_set() -> Any:
    return {1, 2}


@task(max_retries=0)  # type: ignore[call-overload, untyped-decorator]  # DramatiqTask's option
def never_retried(key: str) -> None:
    calls[key] += 1
    raise ConnectionError("would be retried by default")


spans: list[tuple[int, float, float]] = []


@task(  # type: ignore[call-overload, untyped-decorator]  # DramatiqTask's options
    takes_context=True, concurrency_key="account:{account_id}", concurrency_limit=1
)
def one_per_account(context: TaskContext[Any, Any], account_id: int) -> None:
    started = time.monotonic()
    time.sleep(0.05)
    spans.append((account_id, started, time.monotonic()))


fair_starts: list[int] = []


@task(fairness_key="account:{account_id}")  # type: ignore[call-overload, untyped-decorator]
def fair_per_account(account_id: int) -> None:
    fair_starts.append(account_id)


@task
def recovers_when_retried(key: str) -> str:
    calls[key] += 1
    if calls[key] == 1:
        raise PermanentJobError("broken until an operator retries")
    return "recovered"


def plain(x: int) -> int:
    return x


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    calls.clear()


def run_worker(broker: dramatiq.Broker, queue: str = "default") -> None:
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        join(queue)
    finally:
        worker.stop()
    ledger.flush()


def test_it_runs_an_enqueued_task_and_keeps_its_return_value(broker: dramatiq.Broker) -> None:
    result = add.enqueue(2, 3)
    assert result.status.value == "READY"
    assert add.get_result(result.id).status == TaskResultStatus.READY

    run_worker(broker)
    result.refresh()

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.attempts == 1
    assert len(result.worker_ids) == 1
    assert result.errors == []
    assert result.args == [2, 3]
    assert result.enqueued_at is not None
    assert result.started_at is not None
    assert result.finished_at is not None
    assert result.enqueued_at <= result.started_at <= result.finished_at
    assert result.last_attempted_at == result.started_at
    assert Job.objects.get(message_id=result.id).actor_name == add.module_path


def test_it_retries_a_transient_failure_with_one_worker_id_per_attempt(
    broker: dramatiq.Broker,
) -> None:
    result = flaky.enqueue("once")

    run_worker(broker)
    result.refresh()

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "done after 2"
    assert result.attempts == 2
    assert len(result.worker_ids) == 2
    [error] = result.errors
    assert error.exception_class_path == "builtins.ConnectionError"
    assert error.exception_class is ConnectionError
    assert "the network blinked" in error.traceback
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.started_at < result.last_attempted_at  # first start, then the retry's


def test_it_fails_a_permanent_failure_at_once_with_its_redacted_traceback(
    broker: dramatiq.Broker,
) -> None:
    result = broken.enqueue("<b>this</b>")

    run_worker(broker)
    result.refresh()

    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    [error] = result.errors
    assert error.exception_class is PermanentJobError
    assert "Traceback (most recent call last)" in error.traceback
    assert "cannot handle <b>this</b>" in error.traceback
    assert "hunter2" not in error.traceback
    assert "password=[redacted]" in error.traceback
    assert result.finished_at is not None
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_it_honours_run_after(broker: dramatiq.Broker) -> None:
    run_after = timezone.now() + timedelta(seconds=1)
    result = add.using(run_after=run_after).enqueue(1, 1)
    ledger.flush()
    assert Job.objects.get(message_id=result.id).state == "delayed"
    assert add.get_result(result.id).status == TaskResultStatus.READY

    run_worker(broker)
    result.refresh()

    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.started_at is not None
    assert result.started_at >= run_after


def run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    # In a thread of its own: a browser test's Playwright keeps an event loop
    # running in the main thread for the rest of the session.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def test_it_runs_async_tasks_and_enqueues_from_async_code(broker: dramatiq.Broker) -> None:
    result = run_coroutine(add_later.aenqueue(20, 22))

    run_worker(broker)
    run_coroutine(result.arefresh())

    assert result.status == TaskResultStatus.SUCCESSFUL
    values: list[Any] = [result.return_value, run_coroutine(add_later.aget_result(result.id))]
    assert values[0] == 42
    assert values[1].return_value == 42


def test_it_gives_tasks_a_context_with_the_attempt_number(broker: dramatiq.Broker) -> None:
    result = which_attempt.enqueue("ctx")

    run_worker(broker)
    result.refresh()

    assert calls["ctx"] == 2
    assert result.return_value == {"attempt": 2, "id": result.id}


def test_it_sends_the_signals_in_order_with_the_backend_as_sender(
    broker: dramatiq.Broker,
) -> None:
    seen: list[tuple[str, Any, str, str]] = []

    def recorder(name: str) -> Any:
        def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
            seen.append((name, sender, task_result.id, str(task_result.status)))

        return receive

    receivers = {
        task_enqueued: recorder("enqueued"),
        task_started: recorder("started"),
        task_finished: recorder("finished"),
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    try:
        result = flaky.enqueue("signals")
        run_worker(broker)
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)

    assert seen == [
        ("enqueued", DramatiqBackend, result.id, "READY"),
        ("started", DramatiqBackend, result.id, "RUNNING"),  # attempt 1 fails, will retry
        ("started", DramatiqBackend, result.id, "RUNNING"),
        ("finished", DramatiqBackend, result.id, "SUCCESSFUL"),
    ]


def enqueue_then_fail() -> Any:
    try:
        with transaction.atomic():
            result = add.enqueue(1, 2)
            assert OutboxMessage.objects.filter(message_id=result.id).exists()
            raise RuntimeError("the request failed")
    except RuntimeError:
        return result


def test_it_sends_nothing_for_a_rolled_back_transaction() -> None:
    enqueued: list[str] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        enqueued.append(task_result.id)

    task_enqueued.connect(receive)
    try:
        rolled_back = enqueue_then_fail()
        assert queued_messages("default") == []
        assert not OutboxMessage.objects.exists()
        assert enqueued == []
        with pytest.raises(TaskResultDoesNotExist):
            add.get_result(rolled_back.id)

        # The same enqueue in a transaction that commits is published on commit.
        with transaction.atomic():
            committed = add.enqueue(1, 2)
            assert queued_messages("default") == []
        assert [m.message_id for m in queued_messages("default")] == [committed.id]
        assert enqueued == [committed.id]
    finally:
        task_enqueued.disconnect(receive)


def test_it_keeps_run_after_through_the_outbox(broker: dramatiq.Broker) -> None:
    with transaction.atomic():
        result = add.using(run_after=timezone.now() + timedelta(minutes=5)).enqueue(1, 2)
    ledger.flush()

    assert Job.objects.get(message_id=result.id).state == "delayed"
    assert queued_messages("default") == []


def test_a_result_is_found_right_after_the_enqueue_with_the_shipped_batching(settings) -> None:
    # Given the shipped 200 ms ledger batches (the suite writes at once), under
    # which a first send reaches the ledger through its Redis intake
    settings.JOBS_LEDGER_FLUSH_MS = 200
    # When a task is enqueued and its result asked for at once, with no worker
    result = add.enqueue(2, 3)
    # Then it is found, waiting
    assert add.get_result(result.id).status == TaskResultStatus.READY


@pytest.mark.parametrize("run_after", [None, timedelta(minutes=5)], ids=["now", "later"])
def test_a_result_is_found_inside_a_transaction_for_a_task_sent_before_it(
    settings, run_after: timedelta | None
) -> None:
    # Given the shipped ledger batches, and a task sent (outside a transaction:
    # straight to Redis) before the reader's transaction: its row is still in
    # the Redis intake, which a reader inside a transaction cannot drain
    # (issue 29, item 6; before: TaskResultDoesNotExist)
    settings.JOBS_LEDGER_FLUSH_MS = 200
    sender = add.using(run_after=timezone.now() + run_after) if run_after else add
    result = sender.enqueue(4, 5)  # one sent with run_after waits in "<queue>.DQ"
    assert not Job.objects.filter(message_id=result.id).exists()

    # When it is read inside a transaction
    with transaction.atomic():
        found = add.get_result(result.id)

    # Then it is found, waiting, with its arguments
    assert found.status == TaskResultStatus.READY
    assert found.args == [4, 5]


def test_it_raises_for_an_unknown_id() -> None:
    with pytest.raises(TaskResultDoesNotExist):
        add.get_result("no-such-id")


def test_it_fails_a_return_value_it_cannot_store_with_a_clear_error(
    broker: dramatiq.Broker,
) -> None:
    result = returns_a_set.enqueue()

    run_worker(broker)
    result.refresh()

    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1  # not retried: running it again cannot help
    [error] = result.errors
    assert error.exception_class_path == "jobs.tasks_framework.runner.InvalidReturnValue"
    assert "returned a set, which cannot be stored as a task result" in error.traceback


def test_it_checks_payloads_against_the_signature(broker: dramatiq.Broker) -> None:
    result = add.enqueue("two", 3)  # type: ignore[arg-type]

    run_worker(broker)
    result.refresh()

    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path == "jobs.middleware.payloads.InvalidPayload"


def test_a_task_may_set_its_own_retries(broker: dramatiq.Broker) -> None:
    result = never_retried.enqueue("own")

    run_worker(broker)
    result.refresh()

    assert calls["own"] == 1
    assert result.status == TaskResultStatus.FAILED
    # Without the option the platform default (2 retries) applies:
    assert Job.objects.get(message_id=result.id).max_attempts == 1
    assert Job.objects.get(message_id=flaky.enqueue("x").id).max_attempts == 3


def test_it_refuses_priority_and_far_run_after() -> None:
    with pytest.raises(InvalidTask, match="priority"):
        task(priority=10)(plain)
    with pytest.raises(InvalidTask, match="7 days"):
        add.using(run_after=timezone.now() + timedelta(days=8)).enqueue(1, 1)


def test_the_admin_lists_tasks_by_module_path_and_retries_them(
    broker: dramatiq.Broker, client: Client
) -> None:
    result = recovers_when_retried.enqueue("admin")
    run_worker(broker)
    job = Job.objects.get(message_id=result.id)
    assert job.state == "failed"
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    assert recovers_when_retried.module_path in client.get("/admin/jobs/job/").content.decode()

    data = {"action": "retry_selected", "_selected_action": [job.pk]}
    client.post("/admin/jobs/job/", data, follow=True)
    run_worker(broker)

    retry = Job.objects.get(retry_of__message_id=result.id)
    retried = recovers_when_retried.get_result(retry.message_id)
    assert retried.status == TaskResultStatus.SUCCESSFUL
    assert retried.return_value == "recovered"


def test_a_result_follows_the_operators_retry_of_its_task(
    broker: dramatiq.Broker, client: Client
) -> None:
    # Given a task that failed for good, and the result enqueue() gave for it
    result = recovers_when_retried.enqueue("chain")
    run_worker(broker)
    result.refresh()
    assert result.status.value == "FAILED"  # .value: mypy would keep the narrowed status
    job = Job.objects.get(message_id=result.id)

    # When an operator retries it from the admin and the retry succeeds
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    client.post("/admin/jobs/job/", {"action": "retry_selected", "_selected_action": [job.pk]})
    run_worker(broker)
    result.refresh()

    # Then the original id reads as the retry finished, with both attempts
    retry = Job.objects.get(retry_of__message_id=result.id)
    assert result.id == job.message_id
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == "recovered"
    assert result.attempts == 2
    assert [e.exception_class_path for e in result.errors] == ["jobs.errors.PermanentJobError"]
    assert result.finished_at == retry.finished_at
    # first start: the failed job's; last attempt: the retry's
    assert (result.started_at, result.last_attempted_at) == (job.started_at, retry.started_at)
    # and the retry's own id reads the retry alone
    retried = recovers_when_retried.get_result(retry.message_id)
    assert retried.status == TaskResultStatus.SUCCESSFUL
    assert (retried.attempts, retried.errors) == (1, [])


def test_right_after_an_operators_retry_the_result_waits_for_the_retry(
    broker: dramatiq.Broker, settings
) -> None:
    # The shipped batching: the retry's row reaches the ledger through the intake.
    settings.JOBS_LEDGER_FLUSH_MS = 200
    result = never_retried.enqueue("retried-later")
    run_worker(broker)
    job = Job.objects.get(message_id=result.id)
    assert job.state == "failed"
    # Another process is draining the intake (it holds the lock) when the
    # operator retries: the retry's row is not written yet.
    redis = redis_broker()
    redis.client.set(f"{redis.namespace}:ledger.intake.lock", "another-process", px=10_000)
    assert operations.retry_jobs(Job.objects.filter(pk=job.pk)).done == 1

    polled = never_retried.get_result(result.id)

    # Not the failure before it: a client polling until the end goes on.
    assert polled.status == TaskResultStatus.READY
    assert polled.finished_at is None


def test_a_retry_whose_row_is_gone_leaves_the_result_at_the_failure_not_waiting(
    broker: dramatiq.Broker,
) -> None:
    result = never_retried.enqueue("retried-then-pruned")
    run_worker(broker)
    job = Job.objects.get(message_id=result.id)
    assert operations.retry_jobs(Job.objects.filter(pk=job.pk)).done == 1
    job.refresh_from_db()
    # The retry's row pruned (or deleted) later, the failed original kept.
    Job.objects.filter(message_id=job.retried_as).delete()

    polled = never_retried.get_result(result.id)

    assert polled.status == TaskResultStatus.FAILED  # terminal, not READY for ever


def test_a_task_taking_a_context_has_its_secret_argument_redacted_by_name() -> None:
    # The context is not a positional argument of the message: names must not
    # shift by one (api_key was read as user_id and stored in clear).
    result = with_context_and_a_key.enqueue(7, "k-123456789")
    ledger.flush()

    assert Job.objects.get(message_id=result.id).args == [7, "[redacted]"]


def test_a_task_declares_a_concurrency_key_over_its_arguments(broker: dramatiq.Broker) -> None:
    # Four threads, six tasks of one account: one at a time. The key is built
    # from the task's own arguments (the context the worker supplies is not one).
    spans.clear()
    for _ in range(6):
        one_per_account.enqueue(7)
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=4)
    worker.start()
    try:
        join("default")
        deadline = time.monotonic() + 15
        while len(spans) < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        worker.stop()
    assert len(spans) == 6
    ordered = sorted(spans, key=lambda span: span[1])
    assert all(nxt[1] >= prev[2] for prev, nxt in itertools.pairwise(ordered))


def test_a_task_declares_a_fairness_key_over_its_arguments(broker: dramatiq.Broker) -> None:
    # Account 1's 30 tasks were sent first; account 2's 3 take turns with them.
    fair_starts.clear()
    for account in [1] * 30 + [2] * 3:
        fair_per_account.enqueue(account)
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=1)
    worker.start()
    try:
        join("default")
    finally:
        worker.stop()
    assert len(fair_starts) == 33
    assert max(i for i, account in enumerate(fair_starts) if account == 2) < 10, fair_starts
