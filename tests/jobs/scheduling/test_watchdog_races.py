"""The watchdog against a ledger that has not caught up with Redis yet.

The ledger learns a message's new Redis id (a delayed message moved to its
queue, a paused queue's message put back) in a later batch, or never; a job's
end may be written after its worker stopped waiting. The watchdog must not turn
any of that into a failure for good.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, cast

import dramatiq
import pytest
from django.utils import timezone

from jobs.broker import queues, redis_broker
from jobs.ledger import operations
from jobs.ledger import writer as ledger
from jobs.models import Job
from jobs.scheduling import watchdog
from jobs.scheduling.watchdog import reconcile_stalled_jobs
from tests.conftest import IDLE_POLL_MS, join, queued_messages

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "watchdog-races"
RAN: list[int] = []


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def remind(n: int) -> None:
    RAN.append(n)


class Gate:
    """Holds the ledger's batches back until opened: a batch still on its way."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self._write = ledger._write_safely

    def write(self, events: list[ledger.Event], **options: Any) -> None:
        self.opened.wait(30)
        self._write(events, **options)


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    gate = Gate()
    monkeypatch.setattr(ledger, "_write_safely", gate.write)
    yield gate
    gate.opened.set()


@pytest.fixture
def batches(settings: Any) -> None:
    """The shipped 200 ms ledger batches (the suite writes each event at once)."""
    settings.JOBS_LEDGER_FLUSH_MS = 200
    RAN.clear()


def started_worker() -> dramatiq.Worker:
    worker = dramatiq.Worker(dramatiq.get_broker(), worker_timeout=IDLE_POLL_MS, worker_threads=1)
    worker.start()
    return worker


def sent_long_ago(message: dramatiq.Message[Any]) -> Job:
    """The job's row, dated back past the watchdog's grace (60 s)."""
    rows = Job.objects.filter(message_id=message.message_id)
    rows.update(enqueued_at=timezone.now() - timedelta(minutes=2))
    return rows.get()


def move_due_message() -> str:
    """What a worker does with a delayed message that came due (dramatiq's
    ``Worker.handle_delayed_messages``): enqueue a copy in its queue under a new
    Redis id, then ack the delay-queue copy. Returns the new Redis id."""
    broker = redis_broker()
    consumer = broker.consume(f"{QUEUE}.DQ", prefetch=1, timeout=1000)
    delayed = next(consumer)
    assert delayed is not None
    due = delayed.copy(queue_name=QUEUE)
    del due.options["eta"]
    moved = broker.enqueue(due)
    consumer.ack(delayed)
    consumer.close()
    return str(moved.options["redis_message_id"])


@pytest.mark.usefixtures("batches")
def test_it_never_fails_a_delayed_job_whose_move_to_its_queue_the_ledger_has_not_written(
    gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watchdog first catches up with the ledger intake, which would write
    # the move itself (through the gate: 30 s of the test's time). Held back
    # here, as a batch on its way is: the watchdog must find the message where
    # it went on its own.
    monkeypatch.setattr(watchdog, "intake", SimpleNamespace(catch_up=lambda: None))
    # Given a delayed job, recorded, and its message moved to its queue under a
    # new Redis id while the batch saying so is still on its way
    message = remind.send_with_options(args=(1,), delay=60_000)
    gate.opened.set()
    ledger.flush()
    gate.opened.clear()
    row = sent_long_ago(message)
    assert (row.state, row.redis_message_id) == ("delayed", message.options["redis_message_id"])
    new_id = move_due_message()

    # When the watchdog runs before that batch is written
    findings = reconcile_stalled_jobs()

    # Then it finds the message where it went, and the job runs and succeeds
    assert findings == []
    row.refresh_from_db()
    assert (row.state, row.redis_message_id) == ("enqueued", new_id)
    gate.opened.set()
    worker = started_worker()
    try:
        join(QUEUE)
        ledger.flush()
    finally:
        worker.stop()
    row.refresh_from_db()
    assert (RAN, row.state, row.error_type, row.attempts) == ([1], "succeeded", "", 1)


@pytest.mark.usefixtures("batches")
def test_a_job_whose_end_is_not_written_yet_stays_unacked_and_is_never_guessed(
    gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job that ran while the database is too slow to write its end: its
    # worker holds the ack until that write lands (jobs.broker.acks), however
    # long it takes (before, the worker gave up waiting after DURABLE_WAIT, acked,
    # and the watchdog then had only a guess to go on)
    monkeypatch.setattr(ledger.BatchWriter, "DURABLE_WAIT", 0.1)  # no wait to lean on
    message = remind.send(2)
    gate.opened.set()
    ledger.flush()
    gate.opened.clear()
    worker = started_worker()
    try:
        deadline = time.monotonic() + 10
        while RAN != [2] and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # what the old worker would have waited before acking
        row = sent_long_ago(message)
        assert (RAN, row.state) == ([2], "enqueued")

        # When the watchdog looks at the job, nothing recorded past "enqueued"
        findings = reconcile_stalled_jobs()

        # Then Redis still holds the message (unacked), so there is nothing to guess
        assert findings == []
        row.refresh_from_db()
        assert (row.state, row.error_type) == ("enqueued", "")

        # and once the write lands the job is succeeded, then acked
        gate.opened.set()
        join(QUEUE)
        ledger.flush()
    finally:
        gate.opened.set()
        worker.stop()
    row.refresh_from_db()
    assert (row.state, row.error_type, row.error_message) == ("succeeded", "", "")
    assert row.attempts == 1


@pytest.mark.usefixtures("batches")
def test_it_leaves_a_job_waiting_in_a_paused_queue_alone(worker: dramatiq.Worker) -> None:
    # Given a job whose queue has been paused for longer than the grace: each
    # trip back to the delay queue gives its message a new Redis id, which the
    # ledger does not record (the same attempt, no step forward)
    queues.pause(QUEUE)
    message = remind.send(3)
    time.sleep(0.5)  # a few trips, JOBS_PAUSE_RECHECK_MS apart
    row = sent_long_ago(message)
    client = redis_broker().client

    def held() -> list[bytes]:
        keys = client.hkeys(f"dramatiq:{QUEUE}.msgs") + client.hkeys(f"dramatiq:{QUEUE}.DQ.msgs")
        return cast(list[bytes], keys)

    # A trip moves the message between the two hashes (briefly in both, or being
    # moved): wait for a moment it sits in exactly one, under a new id.
    deadline = time.monotonic() + 10
    snapshot = held()
    # (and wait for a first trip, if the 0.5 s did not see one on a loaded machine)
    while (len(snapshot) != 1 or row.redis_message_id.encode() in snapshot) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.02)
        snapshot = held()
    assert len(snapshot) == 1
    assert row.redis_message_id.encode() not in snapshot

    # When the watchdog runs
    findings = reconcile_stalled_jobs()

    # Then it is still waiting, and runs once the queue is resumed
    assert findings == []
    assert Job.objects.get(pk=row.pk).state in ("enqueued", "delayed")
    queues.resume(QUEUE)
    join(QUEUE)
    assert (RAN, Job.objects.get(pk=row.pk).state) == ([3], "succeeded")


def test_a_job_that_truly_vanished_is_failed_and_can_be_retried(settings: Any) -> None:
    # Given a waiting job whose message Redis lost under any id
    settings.JOBS_WATCHDOG_GRACE_S = 0
    message = remind.send(4)
    redis_broker().client.delete(f"dramatiq:{QUEUE}", f"dramatiq:{QUEUE}.msgs")

    # When the watchdog runs
    reconcile_stalled_jobs()

    # Then the job shows as failed, WorkerLost, and a retry sends it again
    row = Job.objects.get(message_id=message.message_id)
    assert (row.state, row.error_type) == ("failed", "WorkerLost")
    assert operations.retry_jobs(Job.objects.filter(pk=row.pk)).done == 1
    assert [m.args for m in queued_messages(QUEUE)] == [(4,)]
