"""Every state path leaves the right ledger record: real Redis, in-process worker."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import dramatiq
import pytest
from django.db import connection

from jobs.broker import queues
from jobs.errors import PermanentJobError
from jobs.ledger import writer as ledger
from jobs.middleware import ledger as ledger_middleware
from jobs.models import Job, JobAttempt
from tests.conftest import IDLE_POLL_MS, join

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "ledger-test"
SECRET = "hunter2"
calls: Counter[str] = Counter()


@dramatiq.actor(queue_name=QUEUE)
def succeed(value: int, password: str = "") -> None:
    calls["succeed"] += 1


@dramatiq.actor(queue_name=QUEUE)
def fail_times(key: str, failures: int) -> None:
    calls[key] += 1
    if calls[key] <= failures:
        raise ConnectionError(f"transient failure {calls[key]}")


@dramatiq.actor(queue_name=QUEUE)
def fail_permanently() -> None:
    raise PermanentJobError("bad payload <script>alert(1)</script>")


@dramatiq.actor(queue_name=QUEUE, time_limit=200, max_retries=0)
def sleep_too_long() -> None:
    # Short sleeps: the time limit is raised asynchronously between bytecodes.
    for _ in range(100):
        time.sleep(0.05)


@dramatiq.actor(queue_name=QUEUE, max_retries=1)
def check_password(user_id: int, password: str) -> None:
    int(password)  # a library error that echoes its input without naming it


@dramatiq.actor(queue_name=QUEUE, max_age=1)
def short_lived() -> None:
    calls["short_lived"] += 1


@dramatiq.actor(queue_name=QUEUE, refers_to={"user_id": "auth.User"})
def remember(user_id: int, data: dict[str, Any] | None = None, token: str = "") -> None:
    calls["remember"] += 1


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    calls.clear()


def job_of(message: dramatiq.Message[Any]) -> Job:
    ledger.flush()
    return Job.objects.get(message_id=message.message_id)


def run(message: dramatiq.Message[Any], broker: dramatiq.Broker) -> Job:
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        join(QUEUE)
    finally:
        worker.stop()
    return job_of(message)


def test_a_sent_message_is_recorded_as_enqueued_with_redacted_arguments() -> None:
    message = succeed.send(41, password="hunter2")

    job = job_of(message)
    assert job.state == "enqueued"
    assert (job.actor_name, job.queue_name) == ("succeed", QUEUE)
    assert job.args == [41]
    assert job.kwargs == {"password": "[redacted]"}
    assert job.max_attempts == 3
    assert job.attempts == 0


def test_a_password_sent_positionally_is_recorded_redacted() -> None:
    # Given a password passed as the actor's second positional argument
    message = succeed.send(8, SECRET)

    # Then the ledger (and the admin that shows it) names it by its parameter
    assert job_of(message).args == [8, "[redacted]"]


def test_a_delayed_message_is_recorded_as_delayed() -> None:
    message = succeed.send_with_options(args=(1,), delay=60_000)

    job = job_of(message)
    assert job.state == "delayed"
    assert job.next_retry_at is not None
    assert job.queue_name == QUEUE


def test_a_batched_enqueued_row_holds_every_field_the_middleware_builds(
    broker: dramatiq.Broker, settings
) -> None:
    # Given a send recorded with the shipped batching (written by the writer thread)
    settings.JOBS_LEDGER_FLUSH_MS = 60_000
    message = remember.send_with_options(
        args=(7,), kwargs={"token": "t0ps3cret"}, max_retries=4, time_limit=9_000
    )
    job = job_of(message)
    # Then the row has what the middleware builds, field by field
    expected = ledger_middleware._create_fields(broker, message)
    stored = {name: getattr(job, name) for name in expected}
    assert stored == expected
    assert job.kwargs == {"token": "[redacted]"}
    assert (job.max_attempts, job.options) == (5, {"max_retries": 4, "time_limit": 9_000})
    assert list(job.references.values_list("subject", flat=True)) == ["auth.user:7"]


def test_an_argument_changed_after_the_send_is_recorded_as_sent(settings) -> None:
    # Given a mutable argument, changed by its sender right after the send and
    # before the ledger writes its batch
    settings.JOBS_LEDGER_FLUSH_MS = 60_000
    data = {"plan": "free", "password": SECRET}
    message = remember.send(7, data)
    data["plan"] = "changed"
    data["api_key"] = "added"
    # Then the ledger keeps what was sent (redacted), as the worker will see it
    assert job_of(message).args == [7, {"plan": "free", "password": "[redacted]"}]


def test_success_records_timings_and_the_worker(broker: dramatiq.Broker) -> None:
    message = succeed.send(1)

    job = run(message, broker)

    assert job.state == "succeeded"
    assert job.attempts == 1
    assert job.started_at is not None
    assert job.finished_at is not None
    assert job.enqueued_at <= job.started_at <= job.finished_at
    assert job.duration_ms is not None
    assert job.worker_pid is not None
    assert job.worker_host
    assert job.error_type == ""
    assert not JobAttempt.objects.exists()


def test_a_transient_failure_then_success_keeps_the_failed_attempt(broker: dramatiq.Broker) -> None:
    message = fail_times.send("once", 1)

    job = run(message, broker)

    assert job.state == "succeeded"
    assert job.attempts == 2
    [attempt] = JobAttempt.objects.filter(job=job)
    assert attempt.number == 1
    assert attempt.error_type == "ConnectionError"
    assert "transient failure 1" in attempt.traceback


def test_exhausted_retries_fail_the_job_with_every_attempt(broker: dramatiq.Broker) -> None:
    message = fail_times.send("always", 99)

    job = run(message, broker)

    assert job.state == "failed"
    assert job.attempts == 3
    assert job.error_type == "ConnectionError"
    assert job.error_message == "transient failure 3"
    numbers = list(JobAttempt.objects.filter(job=job).values_list("number", "error_message"))
    assert numbers == [(n, f"transient failure {n}") for n in (1, 2, 3)]


def test_a_permanent_failure_is_failed_after_one_attempt(broker: dramatiq.Broker) -> None:
    message = fail_permanently.send()

    job = run(message, broker)

    assert job.state == "failed"
    assert job.attempts == 1
    assert job.error_type == "PermanentJobError"
    assert "Traceback" in job.traceback
    assert JobAttempt.objects.filter(job=job).count() == 1


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((7,), {"password": SECRET}), ((7, SECRET), {})],
    ids=["by keyword", "positionally"],
)
def test_an_error_echoing_a_secret_argument_is_recorded_without_it(
    broker: dramatiq.Broker, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    # Given a job whose password ends up in its error message, unnamed
    message = check_password.send(*args, **kwargs)

    # When both of its attempts fail
    job = run(message, broker)

    # Then neither the job nor any attempt keeps the password
    attempts = list(JobAttempt.objects.filter(job=job).order_by("number"))
    assert (job.state, len(attempts)) == ("failed", 2)
    texts = [job.error_message, job.traceback]
    texts += [text for attempt in attempts for text in (attempt.error_message, attempt.traceback)]
    assert not [text for text in texts if SECRET in text]
    assert job.error_message == "invalid literal for int() with base 10: '[redacted]'"
    assert "ValueError: invalid literal for int() with base 10: '[redacted]'" in job.traceback


def test_a_time_limit_fails_the_job(booted_broker: dramatiq.Broker) -> None:
    message = sleep_too_long.send()

    job = run(message, booted_broker)

    assert job.state == "failed"
    assert job.error_type == "TimeLimitExceeded"
    assert job.duration_ms is not None
    assert job.duration_ms < 4000  # stopped early; TimeLimit checks once a second


def test_an_expired_message_is_skipped_and_never_runs(broker: dramatiq.Broker) -> None:
    message = short_lived.send()
    time.sleep(0.05)  # older than its max_age of 1 ms

    job = run(message, broker)

    assert job.state == "skipped"
    assert job.skip_reason == "age limit"
    assert calls["short_lived"] == 0


def test_a_cancelled_message_is_skipped_and_never_runs(broker: dramatiq.Broker) -> None:
    # Also what a worker killed during a cancel leaves: the message comes back
    # to a worker while its cancel mark is in Redis.
    message = succeed.send(1)
    queues.cancel([message.message_id])

    job = run(message, broker)

    assert job.state == "cancelled"
    assert job.skip_reason == "cancelled"
    assert calls["succeed"] == 0


def test_a_paused_queue_holds_its_jobs_until_resumed(broker: dramatiq.Broker) -> None:
    queues.pause(QUEUE)
    message = succeed.send(1)
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        time.sleep(0.5)
        assert calls["succeed"] == 0
        assert job_of(message).state == "enqueued"
        assert queues.queue_stats(QUEUE).paused

        queues.resume(QUEUE)
        join(QUEUE)
    finally:
        worker.stop()
    assert calls["succeed"] == 1
    assert job_of(message).state == "succeeded"


def test_a_ledger_write_failure_never_breaks_the_job(broker: dramatiq.Broker, caplog) -> None:
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE jobs_job RENAME TO jobs_job_away")
    try:
        message = succeed.send(7)
        worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
        worker.start()
        join(QUEUE)
        worker.stop()
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE jobs_job_away RENAME TO jobs_job")

    assert calls["succeed"] == 1
    assert "Job ledger write failed" in caplog.text
    assert not Job.objects.filter(message_id=message.message_id).exists()


def test_batched_writes_record_the_same_states_with_fewer_statements(
    broker: dramatiq.Broker, settings
) -> None:
    settings.JOBS_LEDGER_FLUSH_MS = 50
    before = ledger.stats.statements
    messages = [succeed.send(n) for n in range(50)] + [fail_permanently.send()]

    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=4)
    worker.start()
    join(QUEUE)
    worker.stop()
    assert ledger.flush()

    states = Counter(job_of(m).state for m in messages)
    assert states == {"succeeded": 50, "failed": 1}
    statements_per_job = (ledger.stats.statements - before) / len(messages)
    assert statements_per_job < 6  # three events of two statements each, unbatched


def test_a_success_is_written_before_the_message_is_acked(
    broker: dramatiq.Broker, settings
) -> None:
    # A batch interval no test waits for: only a write the worker waited for
    # before acking can be in the database when the queue is empty.
    settings.JOBS_LEDGER_FLUSH_MS = 60_000
    message = succeed.send(1)

    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        join(QUEUE)  # returns once the message is acked
        # A worker killed now loses nothing the ledger needs: the end is written.
        state = Job.objects.filter(message_id=message.message_id).values_list("state", flat=True)
        assert list(state) == ["succeeded"]
    finally:
        worker.stop()
