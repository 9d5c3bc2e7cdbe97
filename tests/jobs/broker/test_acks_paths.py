"""The nack (dead letter) and deferral paths keep "durable before ack";
two in-process Workers share one BatchWriter and a stop of one sends every held
ack; JOBS_LEDGER_FLUSH_MS=0 and JOBS_LEDGER_ENABLED=0 leave no ticket or held id.

Run: bin/test tests/jobs/broker/test_acks_paths.py   (also with --postgres)
"""

from __future__ import annotations

import threading
import time

import dramatiq
import pytest

from jobs.errors import Deferred
from jobs.ledger import writer as ledger
from jobs.models import Job
from tests.conftest import IDLE_POLL_MS, join, wait_until
from tests.jobs.broker.test_acks import held_ids_of, ledger_writes_blocked, queued_ids_of

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE_A, QUEUE_B = "held-a", "held-b"
for _queue in (QUEUE_A, QUEUE_B):
    dramatiq.get_broker().declare_queue(_queue)
deferred_once: set[str] = set()


@dramatiq.actor(queue_name=QUEUE_A, max_retries=0)
def fails(n: int) -> None:
    raise ValueError(f"boom {n}")


@dramatiq.actor(queue_name=QUEUE_A, max_retries=0)
def defers_once(key: str) -> None:
    if key not in deferred_once:
        deferred_once.add(key)
        raise Deferred("not yet", delay=300)


@dramatiq.actor(queue_name=QUEUE_A, max_retries=0)
def quick_a(n: int) -> None:
    pass


@dramatiq.actor(queue_name=QUEUE_B, max_retries=0)
def quick_b(n: int) -> None:
    pass


def hlen(broker, name: str) -> int:
    return int(broker.client.hlen(f"{broker.namespace}:{name}"))


def test_a_failed_job_is_dead_lettered_only_after_its_failure_is_written(broker, settings):
    settings.JOBS_LEDGER_FLUSH_MS = 200
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    messages = [fails.send(n) for n in range(4)]
    try:
        with ledger_writes_blocked():
            worker.start()
            time.sleep(2)
            # the failures are not written: no message dead-lettered yet
            assert hlen(broker, f"{QUEUE_A}.XQ.msgs") == 0
            assert hlen(broker, f"{QUEUE_A}.msgs") == 4
        wait_until(lambda: hlen(broker, f"{QUEUE_A}.XQ.msgs") == 4)
    finally:
        worker.stop()
    ids = [m.message_id for m in messages]
    assert Job.objects.filter(message_id__in=ids, state="failed").count() == 4


def test_a_deferral_is_acked_only_after_it_is_written(broker, settings):
    settings.JOBS_LEDGER_FLUSH_MS = 200
    deferred_once.clear()
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    message = defers_once.send("k")
    try:
        with ledger_writes_blocked():
            worker.start()
            time.sleep(1.5)
            # the original delivery still unacked (its "delayed" event unwritten)
            assert broker.client.hexists(
                f"{broker.namespace}:{QUEUE_A}.msgs", message.options["redis_message_id"]
            )
        join(QUEUE_A)
    finally:
        worker.stop()
    ledger.flush()
    job = Job.objects.get(message_id=message.message_id)
    assert (job.state, job.attempts) == ("succeeded", 1)


def test_stopping_one_of_two_workers_sends_every_held_ack(broker, settings):
    settings.JOBS_LEDGER_FLUSH_MS = 200
    a = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2, queues={QUEUE_A})
    b = dramatiq.Worker(broker, worker_timeout=50, worker_threads=2, queues={QUEUE_B})
    try:
        with ledger_writes_blocked():
            a.start()
            b.start()
            [quick_a.send(n) for n in range(5)]
            [quick_b.send(n) for n in range(5)]
            time.sleep(1)
            assert hlen(broker, f"{QUEUE_A}.msgs") == hlen(broker, f"{QUEUE_B}.msgs") == 5
            # the lock goes 3 s into a's stop: its flush waits for the write
            stopper = threading.Thread(target=a.stop)
            stopper.start()
            time.sleep(3)
        stopper.join(15)
        assert not stopper.is_alive()
        assert hlen(broker, f"{QUEUE_A}.msgs") == 0
        wait_until(lambda: hlen(broker, f"{QUEUE_B}.msgs") == 0)
    finally:
        b.stop()
    writer = ledger._writer
    assert writer is not None
    assert not writer.held
    for consumer_thread in [*a.consumers.values(), *b.consumers.values()]:
        assert not held_ids_of(consumer_thread)


@pytest.mark.parametrize("setting", ["JOBS_LEDGER_FLUSH_MS", "JOBS_LEDGER_ENABLED"])
def test_without_batching_or_ledger_acks_go_at_once_and_nothing_is_held(broker, settings, setting):
    setattr(settings, setting, 0)
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        [quick_a.send(n) for n in range(10)]
        join(QUEUE_A)
        assert hlen(broker, f"{QUEUE_A}.msgs") == 0
        for consumer_thread in worker.consumers.values():
            assert not held_ids_of(consumer_thread)
            assert not queued_ids_of(consumer_thread)
        writer = ledger._writer
        assert writer is None or not writer.held
    finally:
        worker.stop()


def test_a_paused_queues_put_back_is_acked_only_after_its_delayed_event_is_written(
    broker, settings
):
    # A kill between the ack and the write would leave the row without its
    # put-back (still "enqueued" under the acked delivery's Redis id).
    settings.JOBS_LEDGER_FLUSH_MS = 200
    settings.JOBS_PAUSE_RECHECK_MS = 60_000  # the copy stays put back meanwhile
    from jobs.broker import queues

    message = quick_a.send(99)
    ledger.flush()
    queues.pause(QUEUE_A)
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    try:
        with ledger_writes_blocked():
            worker.start()
            wait_until(lambda: hlen(broker, f"{QUEUE_A}.DQ.msgs") == 1)  # put back
            time.sleep(1)
            # the delivery it replaces still unacked: its "delayed" event unwritten
            assert broker.client.hexists(
                f"{broker.namespace}:{QUEUE_A}.msgs", message.options["redis_message_id"]
            )
        wait_until(
            lambda: (
                not broker.client.hexists(
                    f"{broker.namespace}:{QUEUE_A}.msgs", message.options["redis_message_id"]
                )
            )
        )
    finally:
        queues.resume(QUEUE_A)
        worker.stop()
    ledger.flush()
    job = Job.objects.get(message_id=message.message_id)
    # Waiting: a put-back's "delayed" ranks below the "enqueued" it follows
    assert (job.state, job.attempts) == ("enqueued", 0)


@dramatiq.actor(queue_name=QUEUE_A, max_retries=0)
def defers_at_once(key: str) -> None:
    if key not in deferred_once:
        deferred_once.add(key)
        raise Deferred("again at once", delay=0)


def test_a_delay_queue_copys_ack_cannot_take_the_hold_of_the_delivery_that_sent_it(
    broker, settings, monkeypatch
):
    # The copy a deferral sends is acked on the delay queue (moved to the
    # queue) by the same process, with the same message id: with holds kept by
    # message id, that ack took the delivery's, and the delivery was acked
    # with its events unwritten. A slow after hook of a middleware before the
    # Ledger (300 ms here; under GIL contention in production) opens the window.
    from jobs.middleware import metrics

    settings.JOBS_LEDGER_FLUSH_MS = 200
    deferred_once.clear()
    original = metrics.Metrics.after_process_message

    def slow(self, broker, message, *, result=None, exception=None):
        if exception is not None:
            time.sleep(0.3)
        return original(self, broker, message, result=result, exception=exception)

    monkeypatch.setattr(metrics.Metrics, "after_process_message", slow)
    message = defers_at_once.send("k")
    ledger.flush()
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    try:
        with ledger_writes_blocked():
            worker.start()
            time.sleep(1.5)
            # the delivery still unacked: its deferral's events are unwritten
            assert broker.client.hexists(
                f"{broker.namespace}:{QUEUE_A}.msgs", message.options["redis_message_id"]
            )
        join(QUEUE_A)
    finally:
        worker.stop()
