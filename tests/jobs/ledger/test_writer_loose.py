"""Events nothing waits for take no lock, yet every wait still covers them.

A job's start (and an enqueue) goes to the writer's lock-free ``loose`` deque;
a flush, a held ack, a durable event and the writer's batch number them into
the buffer, so whatever waits for "everything recorded so far" waits for them.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from jobs.ledger.writer import (
    PHASE_ENQUEUED,
    PHASE_RUNNING,
    TERMINAL,
    BatchWriter,
    Event,
    progress_of,
)
from jobs.models import Job
from tests.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)
CREATE = {"actor_name": "a", "queue_name": "q", "enqueued_at": datetime.now(UTC)}
NEVER = 3600.0  # a writer that writes only when something waits for it


def plain(message_id: str) -> Event:
    return Event(message_id, "enqueued", progress_of(0, PHASE_ENQUEUED), dict(CREATE))


def start(message_id: str) -> Event:
    return Event(
        message_id,
        "running",
        progress_of(0, PHASE_RUNNING),
        dict(CREATE),
        {"started_at": datetime.now(UTC), "attempts": 1},
    )


def end(message_id: str) -> Event:
    return Event(
        message_id, "succeeded", TERMINAL, dict(CREATE), {"finished_at": datetime.now(UTC)}
    )


def written(*message_ids: str) -> set[str]:
    return set(Job.objects.filter(message_id__in=message_ids).values_list("message_id", flat=True))


def test_a_flush_writes_the_plain_events_recorded_before_it() -> None:
    writer = BatchWriter(NEVER)
    writer.add(plain("m-flush"))
    assert writer.flush()
    assert written("m-flush") == {"m-flush"}


def test_a_durable_event_waits_for_the_plain_events_recorded_before_it() -> None:
    writer = BatchWriter(NEVER)
    writer.add(plain("m-before"))
    writer.add(plain("m-durable"), durable=True)
    assert written("m-before", "m-durable") == {"m-before", "m-durable"}


def test_an_ack_held_after_a_plain_event_is_sent_only_once_that_event_is_written() -> None:
    # Given a plain event (a deferral's "delayed") and then the message's ack held
    writer = BatchWriter(NEVER)
    writer.add(plain("m-held"))
    seq = writer.hold_ack()
    seen: list[set[str]] = []

    def send_acks(items: list[Any]) -> list[Any]:
        seen.append(written("m-held"))
        return []

    # When the consumer hands over the ack, it is held (not sent at once)
    assert writer.after_written(seq, send_acks, "ack")
    # Then it is sent after the event's row was written
    wait_until(lambda: bool(seen), timeout=10)
    assert seen == [{"m-held"}]


def test_eight_threads_of_jobs_ack_each_job_once_and_only_after_its_end_is_written() -> None:
    # Given eight worker threads recording a start (plain) and an end (before
    # the ack) per job, and handing over each ack, while the writer batches
    writer = BatchWriter(0.05)
    acked: list[str] = []
    early: list[str] = []
    mutex = threading.Lock()

    def send_acks(items: list[str]) -> list[str]:
        finished = set(
            Job.objects.filter(message_id__in=items, state="succeeded").values_list(
                "message_id", flat=True
            )
        )
        with mutex:
            acked.extend(items)
            early.extend(item for item in items if item not in finished)
        return []

    def worker(thread: int) -> None:
        for n in range(150):
            message_id = f"m-{thread}-{n}"
            writer.add(start(message_id))
            seq = writer.add(end(message_id), before_ack=True)
            if not writer.after_written(seq, send_acks, message_id):
                send_acks([message_id])  # nothing held it: the consumer acks now

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert writer.flush()
    # Then every job was acked once, none before its end was written
    assert sorted(acked) == sorted(f"m-{t}-{n}" for t in range(8) for n in range(150))
    assert early == []
    assert Job.objects.filter(state="succeeded", attempts=1).count() == 8 * 150


def test_two_deliveries_of_one_message_each_wait_for_their_own_end() -> None:
    # Given two deliveries of one message id in one process (a redelivery while
    # the first still runs), both ends recorded before either ack is handed over
    writer = BatchWriter(NEVER)
    first = writer.add(end("m-twice"), before_ack=True)
    second = writer.add(end("m-twice"), before_ack=True)
    sent: list[Any] = []

    def send_acks(items: list[Any]) -> list[Any]:
        sent.extend(items)
        return []

    # When each consumer hands over its ack, neither goes out unwritten (with
    # a table by message id, the second found nothing and was sent at once)
    assert writer.after_written(first, send_acks, "first")
    assert writer.after_written(second, send_acks, "second")
    assert sent == []
    # Then both go out once the ends are written
    assert writer.flush()
    assert sorted(sent) == ["first", "second"]
