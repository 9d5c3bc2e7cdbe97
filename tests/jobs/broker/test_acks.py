"""Acks held until the ledger wrote the job (jobs.broker.acks): real Redis, real
database, in-process worker."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
from django.db import connections
from dramatiq.brokers.redis import RedisBroker

from jobs.broker.acks import LedgerOrderedConsumer
from jobs.ledger import writer as ledger
from jobs.models import Job
from tests.conftest import IDLE_POLL_MS, join, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "acks-test"
# Declared before any test's worker runs (see tests/jobs/middleware/test_ledger.py).
dramatiq.get_broker().declare_queue(QUEUE)
ran: list[int] = []
_ran_lock = threading.Lock()


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def quick(number: int) -> None:
    with _ran_lock:
        ran.append(number)


@contextlib.contextmanager
def ledger_writes_blocked() -> Iterator[None]:
    """Another connection holds the lock every ledger write needs, as a slow
    database or a long migration would."""
    other = connections.create_connection("default")
    try:
        if other.vendor == "sqlite":
            other.cursor().execute("BEGIN IMMEDIATE")  # the one write lock
        else:
            other.set_autocommit(False)
            other.cursor().execute("LOCK TABLE jobs_job IN EXCLUSIVE MODE")  # reads only
        yield
    finally:
        if other.vendor == "sqlite":
            other.cursor().execute("ROLLBACK")
        else:
            other.rollback()
        other.close()


def held_ids_of(thread: Any) -> set[str]:
    """The ids a worker's consumer thread has handed to the ledger writer."""
    consumer = thread.consumer
    assert isinstance(consumer, LedgerOrderedConsumer)
    return consumer.held_ids


def queued_ids_of(thread: Any) -> set[str]:
    consumer = thread.consumer
    assert isinstance(consumer, LedgerOrderedConsumer)
    return set(consumer.queued_message_ids)


def test_worker_threads_run_the_next_job_while_the_last_ones_ledger_write_waits(
    broker: RedisBroker, settings
) -> None:
    # The shipped batching: the in-process default (0) writes each event at once.
    settings.JOBS_LEDGER_FLUSH_MS = 200
    ran.clear()
    messages = [quick.send(n) for n in range(8)]
    held = f"{broker.namespace}:{QUEUE}.msgs"  # a message's hash entry goes with its ack

    # Given a worker with 2 threads while the database takes no ledger write
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    with ledger_writes_blocked():
        worker.start()
        # When the jobs run for a while (all of them, or 15 s)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: len(ran) >= len(messages), timeout=15)
        time.sleep(0.5)  # (a thread wrongly waiting would not run any more anyway)
        during = len(ran)
        # Then no thread waited for its job's write (a waiting thread stops at
        # one job: 2 in all), and a finished job waiting for its ack took no
        # prefetch slot (2 per thread: 4 in all)
        assert during == len(messages), f"2 threads ran {during} jobs while the ledger waited"
        # and none was acked before its end was written
        assert broker.client.hlen(held) == len(messages)

    # When the database takes writes again, every job ends acked and recorded
    try:
        join(QUEUE)
    finally:
        worker.stop()
    assert ledger.flush()
    assert sorted(ran) == list(range(len(messages)))
    states = Job.objects.filter(message_id__in=[m.message_id for m in messages])
    assert sorted(states.values_list("state", flat=True)) == ["succeeded"] * len(messages)
    assert broker.client.hlen(held) == 0
