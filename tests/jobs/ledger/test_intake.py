"""First sends reach the ledger through its Redis intake (``jobs.ledger.intake``).

Each test sets the shipped 200 ms ledger batches: the suite writes events at
once in-process (tests/conftest.py), and with ``JOBS_LEDGER_FLUSH_MS`` = 0 the
sender writes its own row, no intake involved.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import dramatiq
import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client

from jobs.broker.wakeup import WakeupRedisBroker
from jobs.ledger import intake
from jobs.ledger import writer as ledger
from jobs.ledger.writer import DatabaseUnreachable
from jobs.middleware import ledger as ledger_middleware
from jobs.models import Job
from tests.conftest import IDLE_POLL_MS, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "intake-test"


@dramatiq.actor(queue_name=QUEUE, max_retries=4, refers_to={"user_id": "auth.User"})
def greet(user_id: int, token: str = "") -> None:
    pass


@pytest.fixture(autouse=True)
def _batched(settings: Any) -> None:
    settings.JOBS_LEDGER_FLUSH_MS = 200


def entries(broker: dramatiq.Broker) -> list[bytes]:
    key = intake.intake_key(broker.namespace)  # type: ignore[attr-defined]
    return list(broker.client.lrange(key, 0, -1))  # type: ignore[attr-defined]


def lock_key(broker: dramatiq.Broker) -> str:
    return intake.intake_key(broker.namespace) + ".lock"  # type: ignore[attr-defined]


def test_a_first_send_costs_its_sender_no_ledger_event_and_waits_in_the_intake(
    broker: dramatiq.Broker,
) -> None:
    # Given nothing recorded by this process yet
    events_before = ledger.stats.events

    # When a job is sent
    message = greet.send(7, token="t0ps3cret")

    # Then this process built no event for it, and Redis holds its entry
    # beside the message (same enqueue command)
    assert ledger.stats.events == events_before
    redis_id = message.options["redis_message_id"]
    assert entries(broker) == [f"{QUEUE}\n{redis_id}".encode()]
    assert not Job.objects.filter(message_id=message.message_id).exists()

    # When a reader catches up, the row is what the sender used to write
    assert intake.catch_up()
    job = Job.objects.get(message_id=message.message_id)
    expected = ledger_middleware._create_fields(broker, message)
    assert {name: getattr(job, name) for name in expected} == expected
    assert (job.state, job.redis_message_id, job.max_attempts) == ("enqueued", redis_id, 5)
    assert job.kwargs == {"token": "[redacted]"}
    assert list(job.references.values_list("subject", flat=True)) == ["auth.user:7"]
    assert entries(broker) == []


def test_a_delayed_first_send_is_recorded_delayed_until_its_eta(broker: dramatiq.Broker) -> None:
    message = greet.send_with_options(args=(1,), delay=60_000)

    assert ledger.flush()  # the intake too

    job = Job.objects.get(message_id=message.message_id)
    assert job.state == "delayed"
    assert job.next_retry_at is not None
    assert job.next_retry_at.timestamp() == pytest.approx(message.options["eta"] / 1000, abs=1)
    assert job.queue_name == QUEUE


def test_a_worker_drains_the_intake_with_no_reader_asking(broker: dramatiq.Broker) -> None:
    # Given a running worker and a job that will wait an hour in the delay queue
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=1)
    worker.start()
    try:
        message = greet.send_with_options(args=(2,), delay=3_600_000)

        # Then its row appears within a few of the worker's ledger intervals
        wait_until(
            lambda: Job.objects.filter(message_id=message.message_id, state="delayed").exists(),
            timeout=5,
        )
        wait_until(lambda: entries(broker) == [], timeout=5)
    finally:
        worker.stop()


def test_an_entry_whose_message_already_went_is_dropped(broker: dramatiq.Broker) -> None:
    # Given a job whose message left Redis before its entry was read (the
    # worker ran and acked it, and its own events carried the row)
    message = greet.send(3)
    redis_id = message.options["redis_message_id"]
    broker.client.hdel(f"{broker.namespace}:{QUEUE}.msgs", redis_id)  # type: ignore[attr-defined]

    # When the intake is drained, the entry goes and no "enqueued" row appears
    assert intake.catch_up()
    assert entries(broker) == []
    assert not Job.objects.filter(message_id=message.message_id).exists()


def test_entries_stay_until_their_rows_are_committed(
    broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a database that cannot be reached
    message = greet.send(4)

    def unreachable(events: list[ledger.Event], **kwargs: Any) -> None:
        raise DatabaseUnreachable("connection refused")

    monkeypatch.setattr(ledger, "_write_safely", unreachable)

    # When the intake is drained, nothing is lost: the entry stays
    assert not intake.catch_up(timeout=0.2)
    assert len(entries(broker)) == 1
    assert not broker.client.exists(lock_key(broker))  # type: ignore[attr-defined]

    # And once the database answers, the next drain writes it
    monkeypatch.undo()
    assert intake.catch_up()
    assert Job.objects.get(message_id=message.message_id).state == "enqueued"
    assert entries(broker) == []


def test_a_drainer_whose_lock_expired_leaves_the_trim_to_its_successor(
    broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a drainer whose lock expires, and is taken by another, during its
    # write (a stalled process), while a new job is sent behind its batch
    first = greet.send(5)
    write_now = ledger.write_now

    def slow_write(events: list[ledger.Event]) -> None:
        write_now(events)
        broker.client.set(lock_key(broker), "another-drainer")  # type: ignore[attr-defined]
        greet.send(6)

    monkeypatch.setattr(ledger, "write_now", slow_write)

    # When it finishes its batch, it does not trim what the other may be reading
    assert not intake.drain(broker)
    assert len(entries(broker)) == 2
    assert broker.client.get(lock_key(broker)) == b"another-drainer"  # type: ignore[attr-defined]

    # And the successor writes both (the first twice, idempotently)
    monkeypatch.undo()
    broker.client.delete(lock_key(broker))  # type: ignore[attr-defined]
    assert intake.drain(broker)
    assert entries(broker) == []
    assert Job.objects.filter(actor_name="greet").count() == 2
    assert Job.objects.get(message_id=first.message_id).state == "enqueued"


def test_a_reader_waits_while_another_process_drains(broker: dramatiq.Broker) -> None:
    greet.send(8)
    broker.client.set(lock_key(broker), "another-drainer", px=300)  # type: ignore[attr-defined]

    # A drain that finds the lock taken leaves the entries to its holder
    assert not intake.drain(broker)
    assert len(entries(broker)) == 1
    # A reader waits for it (here: until the holder's lock expires), then drains
    assert intake.catch_up(timeout=3)
    assert entries(broker) == []
    assert Job.objects.filter(actor_name="greet").count() == 1


def test_without_batching_the_sender_writes_its_row_at_once(
    broker: dramatiq.Broker, settings: Any
) -> None:
    # JOBS_LEDGER_FLUSH_MS = 0 asks for every event written at once, by its process
    settings.JOBS_LEDGER_FLUSH_MS = 0
    message = greet.send(9)
    assert entries(broker) == []
    assert Job.objects.get(message_id=message.message_id).state == "enqueued"


def test_the_admin_lists_a_job_sent_a_moment_ago_with_no_worker_running(
    client: Client,
) -> None:
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    message = greet.send(10)

    page = client.get("/admin/jobs/job/")

    assert page.status_code == 200
    assert message.message_id in page.content.decode()


class Boom(Exception):
    pass


def test_a_reader_inside_a_transaction_that_rolls_back_loses_no_row(
    broker: dramatiq.Broker,
) -> None:
    # Given someone's job waiting in the intake
    other = greet.send(11)

    # When a reader inside a transaction (a view under ATOMIC_REQUESTS) asks
    # for every job, and its transaction then rolls back
    def read_then_roll_back() -> None:
        with transaction.atomic():
            assert not intake.catch_up()
            raise Boom

    with pytest.raises(Boom):
        read_then_roll_back()

    # Then the job is still on its way to the ledger, and gets there
    assert len(entries(broker)) == 1
    assert intake.catch_up()
    assert Job.objects.filter(message_id=other.message_id).exists()


def test_an_entry_of_an_actor_this_process_does_not_know_is_kept_for_one_that_does(
    broker: dramatiq.Broker,
) -> None:
    # Given a job of an actor this process lacks (a rolling deploy: a new actor
    # sent by an upgraded web process, drained by an older worker), behind
    # one it knows
    unknown = broker.enqueue(
        dramatiq.Message(
            queue_name=QUEUE, actor_name="added_in_next_release", args=(1,), kwargs={}, options={}
        ),
        delay=3_600_000,
    )
    known = greet.send(12)

    # When this process drains, it writes the one it knows and keeps the other
    # aside: off the intake, so that its next drains do not read it again (for
    # as long as a deploy lasts; before, it went back onto the intake's tail)
    assert intake.catch_up()
    assert Job.objects.filter(message_id=known.message_id).exists()
    assert not Job.objects.filter(message_id=unknown.message_id).exists()
    assert entries(broker) == []
    assert intake.waiting(broker) == 1  # still counted as not written (metrics)
    assert intake.drain(broker) is True  # nothing to read
    assert intake.peek(unknown.message_id) is not None  # a reader still finds it

    # And a process that knows the actor writes it
    @dramatiq.actor(actor_name="added_in_next_release", queue_name=QUEUE)
    def added_in_next_release(n: int) -> None:
        pass

    try:
        assert intake.catch_up()
    finally:
        del broker.actors["added_in_next_release"]
    assert Job.objects.get(message_id=unknown.message_id).state == "delayed"
    assert entries(broker) == []
    assert intake.waiting(broker) == 0


def test_a_drain_with_a_deadline_stops_after_a_batch_and_frees_the_lock(
    broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a backlog of three batches
    monkeypatch.setattr(intake, "BATCH", 2)
    for n in range(6):
        greet.send(n)

    # When a drainer's pass has a deadline already past, it writes one batch
    # and lets a reader have the lock
    assert intake.drain(broker, deadline=0.0) is False
    assert len(entries(broker)) == 4
    assert not broker.client.exists(lock_key(broker))  # type: ignore[attr-defined]
    assert intake.drain(broker) is True
    assert Job.objects.filter(actor_name="greet").count() == 6


def test_a_stalled_redis_costs_a_reader_its_timeout_not_the_socket_timeout(
    broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a Redis that accepts connections and never answers, behind a
    # client whose socket timeout is 10 s (the broker's)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    stalled = WakeupRedisBroker(
        url=f"redis://127.0.0.1:{port}/0?socket_connect_timeout=2&socket_timeout=10"
    )
    monkeypatch.setattr(intake, "_reader_backoff_until", 0.0)
    try:
        # When a reader catches up with the admin's 1 s budget
        started = time.monotonic()
        assert not intake.catch_up(stalled, timeout=1.0)
        first = time.monotonic() - started
        # Then it gave up within about that budget, and the next reader does
        # not ask again at once
        started = time.monotonic()
        assert not intake.catch_up(stalled, timeout=1.0)
        second = time.monotonic() - started
    finally:
        server.close()
    assert first < 3, first
    assert second < 0.1, second


def test_an_entry_kept_aside_whose_message_is_gone_is_dropped(broker: dramatiq.Broker) -> None:
    # Kept aside by a process that does not know the actor, its message then
    # ran (or was put back as a new copy, or dead-lettered) and no process that
    # knows the actor exists any more (a rollback): nobody would read the list.
    unknown = broker.enqueue(
        dramatiq.Message(
            queue_name=QUEUE, actor_name="rolled_back_actor", args=(1,), kwargs={}, options={}
        ),
        delay=3_600_000,
    )
    still_waiting = broker.enqueue(
        dramatiq.Message(
            queue_name=QUEUE, actor_name="rolled_back_actor", args=(2,), kwargs={}, options={}
        ),
        delay=3_600_000,
    )
    assert intake.catch_up()
    assert intake.waiting(broker) == 2
    broker.client.hdel(  # type: ignore[attr-defined]
        f"{broker.namespace}:{QUEUE}.DQ.msgs",  # type: ignore[attr-defined]
        unknown.options["redis_message_id"],
    )

    assert intake.prune_kept(broker) == 1
    assert intake.waiting(broker) == 1
    assert intake.peek(still_waiting.message_id) is not None
    broker.client.hdel(  # type: ignore[attr-defined]
        f"{broker.namespace}:{QUEUE}.DQ.msgs",  # type: ignore[attr-defined]
        still_waiting.options["redis_message_id"],
    )
    assert intake.prune_kept(broker) == 1
    assert intake.waiting(broker) == 0
    key = f"{intake.intake_key(broker.namespace)}.actors"  # type: ignore[attr-defined]
    assert not broker.client.exists(key)  # type: ignore[attr-defined]


def test_a_message_whose_actor_name_is_not_text_does_not_stop_the_intake(
    broker: dramatiq.Broker,
) -> None:
    # A foreign sender's message with a null actor name: kept aside, its name
    # failed the whole trim, so no later job of the batch ever got its row.
    broker.enqueue(
        dramatiq.Message(queue_name=QUEUE, actor_name=None, args=(), kwargs={}, options={})  # type: ignore[arg-type]
    )
    known = greet.send(12)

    assert intake.catch_up()
    assert Job.objects.filter(message_id=known.message_id).exists()
    assert entries(broker) == []


def test_a_worker_stopped_twice_leaves_the_others_intake_drained(broker: dramatiq.Broker) -> None:
    # One drainer per process, stopped with its last worker. Counted, a worker
    # stopped twice stopped it under another still running: first sends then
    # waited in the intake, out of the admin, until a worker booted again.
    # (On another queue: the job stays unrun, its row can come only from the intake.)
    workers = [
        dramatiq.Worker(broker, queues={"idle-test"}, worker_timeout=IDLE_POLL_MS, worker_threads=1)
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    workers[0].stop()
    workers[0].stop()
    try:
        message = greet.send(8)
        wait_until(lambda: Job.objects.filter(message_id=message.message_id).exists(), timeout=10)
    finally:
        workers[1].stop()
