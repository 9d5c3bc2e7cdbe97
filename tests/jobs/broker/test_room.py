"""A full consumer is woken by the ack that makes room (jobs.broker.room), where
Dramatiq's consumer sleeps its backoff: real Redis, real database, in-process
worker.

The tests set the consumer's ``misses`` high so that Dramatiq's next sleep
would be seconds long (its backoff doubles each time a full consumer looks and
finds no room, up to the worker timeout): on the code before jobs.broker.room
the first three fail by taking that long.

Run: bin/test tests/jobs/broker/test_room.py   (also with --postgres)
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import dramatiq
import pytest

from jobs.broker import room
from jobs.broker.acks import LedgerOrderedConsumer
from tests.conftest import join, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "room-test"
dramatiq.get_broker().declare_queue(QUEUE)

# A full consumer's next look, on Dramatiq's backoff (2.5-5 ms doubled per miss,
# up to the timeout): 2-4 s with 30 misses and this timeout.
TIMEOUT_MS = 4_000
FAR = 30

release = threading.Event()
started: dict[str, float] = {}
finished: dict[str, float] = {}


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def step(name: str, hold: bool = False) -> None:
    started[name] = time.monotonic()
    if hold:
        release.wait(30)
    finished[name] = time.monotonic()


class _ConsumerThread(threading.Thread):
    """Stands for Dramatiq's ConsumerThread: a thread with a work queue."""

    def __init__(self, broker: Any, prefetch: int, misses: int) -> None:
        super().__init__(daemon=True)
        self.work_queue: queue.PriorityQueue[Any] = queue.PriorityQueue()
        self.broker, self.prefetch, self.misses = broker, prefetch, misses
        self.consumer: LedgerOrderedConsumer | None = None
        self.fetched: list[dramatiq.MessageProxy] = []
        self.full = threading.Event()
        self.go = threading.Event()
        self.fetched_at: float | None = None

    def run(self) -> None:
        consumer = self.broker.consume(QUEUE, prefetch=self.prefetch, timeout=TIMEOUT_MS)
        self.consumer = consumer
        while len(self.fetched) < self.prefetch:
            message = next(consumer)
            if message is not None:
                self.fetched.append(message)
        consumer.misses = self.misses
        self.full.set()
        self.go.wait(10)
        while next(consumer) is None:  # waits for room, then fetches
            pass
        self.fetched_at = time.monotonic()


def _start_full(broker: Any, prefetch: int, misses: int = FAR) -> _ConsumerThread:
    for n in range(prefetch + 1):
        step.send(f"m{n}")
    thread = _ConsumerThread(broker, prefetch, misses)
    thread.start()
    assert thread.full.wait(10), "the consumer did not fetch its prefetch"
    assert thread.consumer is not None
    assert thread.consumer.work_queue is thread.work_queue
    return thread


def _waiting_full(
    broker: Any, prefetch: int, waiting: int, settle: float, misses: int = FAR
) -> tuple[_ConsumerThread, LedgerOrderedConsumer]:
    """A full consumer, ``waiting`` of its messages in the work queue, let wait
    for room for ``settle`` seconds."""
    thread = _start_full(broker, prefetch=prefetch, misses=misses)
    consumer = thread.consumer
    assert consumer is not None
    for n in range(waiting):
        thread.work_queue.put((0, n))
    thread.go.set()
    time.sleep(settle)
    return thread, consumer


def test_an_ack_that_frees_half_the_prefetch_wakes_the_consumer_at_once(broker):
    # Given a consumer holding its prefetch (4) whose next look is 2-4 s away,
    # 2 of its messages waiting in the work queue
    thread, consumer = _waiting_full(broker, prefetch=4, waiting=2, settle=0.2)
    assert consumer.room.awaited
    # When worker threads ack two of the messages
    acked = time.monotonic()
    for message in thread.fetched[:2]:
        consumer.ack(message)
    thread.join(10)
    # Then it fetched the message still queued within moments, not seconds
    assert thread.fetched_at is not None, "still waiting 10 s after the acks"
    waited = thread.fetched_at - acked
    print(f"\nfetched {waited * 1000:.1f} ms after the acks (Dramatiq's next look: 2-4 s)")
    assert waited < 1.0


def test_one_free_slot_wakes_the_consumer_only_when_no_message_waits_for_a_thread(broker):
    # Given a consumer holding its prefetch (8), seven of them waiting in the
    # work queue for a thread
    thread, consumer = _waiting_full(broker, prefetch=8, waiting=7, settle=0.2)
    # When one is acked: threads still have work, and one message per fetch
    # would be a Redis round trip per job: the consumer goes on waiting
    consumer.ack(thread.fetched[0])
    time.sleep(0.5)
    assert thread.is_alive()
    assert consumer.room.awaited
    assert thread.fetched_at is None
    # When the threads have taken the waiting messages (the next to finish
    # would find no work) and the next ack comes (6 left: more than half), it
    # fetches
    while not thread.work_queue.empty():
        thread.work_queue.get_nowait()
    acked = time.monotonic()
    consumer.ack(thread.fetched[1])
    thread.join(10)
    assert thread.fetched_at is not None, "still waiting 10 s after the acks"
    assert thread.fetched_at - acked < 1.0


def test_a_worker_starts_the_next_job_as_soon_as_a_thread_is_free(broker):
    # Given a worker of one thread (prefetch 2) running a held job, with the
    # next job waiting in its work queue and a third in Redis
    release.clear()
    started.clear()
    finished.clear()
    worker = dramatiq.Worker(broker, worker_timeout=TIMEOUT_MS, worker_threads=1)
    worker.start()
    try:
        step.send("held", hold=True)
        wait_until(lambda: "held" in started)
        step.send("second")
        step.send("third")
        consumer = worker.consumers[QUEUE].consumer
        assert isinstance(consumer, LedgerOrderedConsumer)
        # (Dramatiq's ConsumerThread: the consumer found the worker's work queue)
        assert consumer.work_queue is worker.work_queue
        wait_until(lambda: consumer.outstanding_message_count == 2 and not consumer.message_cache)
        consumer.misses = FAR  # its next look for room: 2-4 s away
        time.sleep(0.3)
        # When the held job ends (the second runs at once, from the work queue)
        release.set()
        wait_until(lambda: "third" in finished, timeout=20)
    finally:
        release.set()
        worker.stop()
    # Then the third, fetched once the second was taken, started moments later
    gap = started["third"] - finished["held"]
    print(f"\nthird job started {gap * 1000:.0f} ms after the held one ended")
    assert gap < 1.0
    join(QUEUE)


def test_a_consumer_left_waiting_fetches_its_free_slot_when_its_backoff_ends(broker):
    # Given a consumer holding its prefetch (8), seven of them waiting in the
    # work queue, its next look 160-320 ms away
    thread, consumer = _waiting_full(broker, prefetch=8, waiting=7, settle=0.05, misses=6)
    # When one is acked (not worth waking it: the threads have work)
    consumer.ack(thread.fetched[0])
    # Then, its wait over, it fills the free slot as Dramatiq's consumer would
    thread.join(5)
    assert thread.fetched_at is not None, "a free slot left unfilled for 5 s"


@pytest.mark.parametrize(
    ("outstanding", "waiting", "expected"),
    [
        (4, 0, False),  # full: never
        (3, 2, False),  # threads have work: half the prefetch, or its backoff
        (3, 0, True),  # nothing waits for a thread: refill now
        (2, 2, True),  # half free
        (0, 0, True),
    ],
)
def test_when_an_ack_wakes_a_full_consumer_of_prefetch_4(outstanding, waiting, expected):
    work_queue: queue.PriorityQueue[Any] = queue.PriorityQueue()
    for n in range(waiting):
        work_queue.put((0, n))
    assert room.worth_waking(outstanding, 4, work_queue) is expected


def test_a_consumer_with_no_work_queue_is_woken_by_any_room():
    # (iterated by hand, as tests and scripts do)
    assert room.worth_waking(3, 4, None)
    assert not room.worth_waking(4, 4, None)
