"""Deduplicated enqueue through the real broker and an in-process worker."""

from __future__ import annotations

import threading
import time
from collections import Counter

import dramatiq
import pytest

from jobs.broker import queues, redis_broker
from jobs.consistency.dedup import redis_key, send_unique
from jobs.errors import PermanentJobError
from jobs.ledger import writer as ledger
from jobs.ledger.operations import cancel_jobs
from jobs.middleware.dedup import Dedup
from jobs.models import Job
from tests.conftest import IDLE_POLL_MS, AttemptRecorder, join, queued_messages, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("dedup_middleware")]

running = threading.Event()
proceed = threading.Event()
key_held_during_attempts: list[bool] = []
runs: Counter[str] = Counter()


def run_queue(broker: dramatiq.Broker) -> None:
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        join("dedup-tests")
    finally:
        worker.stop()
    ledger.flush()


@dramatiq.actor(queue_name="dedup-tests")
def blocking_job(key: str) -> None:
    running.set()
    assert proceed.wait(10)


@dramatiq.actor(queue_name="dedup-tests", max_retries=3)
def flaky_job(key: str, failures: int) -> None:
    key_held_during_attempts.append(bool(redis_broker().client.exists(redis_key(key))))
    if len(key_held_during_attempts) <= failures:
        raise ConnectionError("transient")


@dramatiq.actor(queue_name="dedup-tests")
def doomed_job(key: str) -> None:
    raise PermanentJobError("bad payload")


def test_a_second_send_while_the_first_waits_enqueues_nothing() -> None:
    first = send_unique(blocking_job, "report:1", "report:1")
    second = send_unique(blocking_job, "report:1", "report:1")
    other = send_unique(blocking_job, "report:2", "report:2")

    assert first is not None
    assert second is None
    assert other is not None
    assert len(queued_messages("dedup-tests")) == 2


def test_a_second_send_while_the_first_runs_enqueues_nothing_then_after_it_enqueues_again(
    worker: dramatiq.Worker,
) -> None:
    running.clear()
    proceed.clear()
    assert send_unique(blocking_job, "report:run", "report:run") is not None
    assert running.wait(5)

    assert send_unique(blocking_job, "report:run", "report:run") is None

    proceed.set()
    join("dedup-tests")
    assert send_unique(blocking_job, "report:run", "report:run") is not None
    join("dedup-tests")


def test_the_key_stays_claimed_between_retries_and_is_freed_after_success(
    worker: dramatiq.Worker, attempts: AttemptRecorder
) -> None:
    key_held_during_attempts.clear()

    send_unique(flaky_job, "flaky", "flaky", 2)
    join("dedup-tests")

    assert len(attempts.attempts) == 3
    assert key_held_during_attempts == [True, True, True]
    assert send_unique(flaky_job, "flaky", "flaky", 0) is not None


def test_retries_exhausted_and_permanent_failures_free_the_key(worker: dramatiq.Worker) -> None:
    key_held_during_attempts.clear()

    send_unique(flaky_job, "exhausted", "exhausted", 99)
    send_unique(doomed_job, "doomed", "doomed")
    join("dedup-tests")

    assert len(key_held_during_attempts) == 4
    client = redis_broker().client
    # Freed by the nack's hook, which runs once the nack is sent: join() can
    # see the queue empty a moment before (CI saw the key still there).
    wait_until(lambda: not client.exists(redis_key("exhausted")), timeout=5)
    wait_until(lambda: not client.exists(redis_key("doomed")), timeout=5)


def test_without_the_middleware_the_key_is_never_freed(
    worker: dramatiq.Worker, dedup_middleware: Dedup, broker: dramatiq.Broker
) -> None:
    position = broker.middleware.index(dedup_middleware)
    broker.middleware.remove(dedup_middleware)
    try:
        running.clear()
        proceed.set()
        send_unique(blocking_job, "orphan", "orphan")
        join("dedup-tests")
        assert send_unique(blocking_job, "orphan", "orphan") is None
    finally:
        broker.middleware.insert(position, dedup_middleware)


@dramatiq.actor(queue_name="dedup-tests")
def counted_job(key: str) -> None:
    runs[key] += 1


def test_it_accepts_a_unique_job_again_once_the_waiting_one_is_cancelled(
    broker: dramatiq.Broker,
) -> None:
    runs.clear()
    first = send_unique(counted_job, "cancelled", "cancelled")
    assert first is not None
    ledger.flush()

    assert cancel_jobs(Job.objects.filter(message_id=first.message_id)).done == 1
    second = send_unique(counted_job, "cancelled", "cancelled")

    assert second is not None  # not refused for the hour of JOBS_DEDUP_TTL_MS
    run_queue(broker)
    assert runs["cancelled"] == 1
    assert Job.objects.get(message_id=first.message_id).state == "cancelled"
    assert Job.objects.get(message_id=second.message_id).state == "succeeded"


def test_a_worker_skipping_a_cancelled_unique_job_frees_its_key(broker: dramatiq.Broker) -> None:
    runs.clear()
    message = send_unique(counted_job, "skipped", "skipped")
    assert message is not None
    queues.cancel([message.message_id])  # the mark alone, as a worker reads it

    run_queue(broker)

    assert runs["skipped"] == 0
    assert not redis_broker().client.exists(redis_key("skipped"))


def test_a_paused_queue_keeps_the_key_of_the_job_it_holds_back(broker: dramatiq.Broker) -> None:
    runs.clear()
    queues.pause("dedup-tests")
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        assert send_unique(counted_job, "paused", "paused") is not None
        time.sleep(0.5)  # several rechecks of JOBS_PAUSE_RECHECK_MS (100 ms in the tests)
        assert send_unique(counted_job, "paused", "paused") is None
        queues.resume("dedup-tests")
        join("dedup-tests")
    finally:
        worker.stop()
    assert runs["paused"] == 1
