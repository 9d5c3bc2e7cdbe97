"""The outbox: written with the transaction, published after commit, once per row."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from django.db import connection, transaction
from django.utils import timezone

from jobs.broker import redis_broker
from jobs.consistency import outbox
from jobs.consistency.outbox import (
    PayloadNotStorable,
    message_send_on_commit,
    publish,
    relay_once,
    send_on_commit,
)
from jobs.ledger import states
from jobs.ledger import writer as ledger
from jobs.models import Job, OutboxMessage
from tests.conftest import join, queued_messages
from tests.examples.tasks import demo_pipeline
from tests.ha.cluster import Process

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def relay_pass(row: OutboxMessage) -> None:
    """The relay coming back to ``row``, its backoff skipped."""
    OutboxMessage.objects.filter(pk=row.pk).update(claimed_until=None)
    publish([row.pk])


def waiting_ids(queue_name: str) -> list[bytes]:
    """The Redis list a consumer pops: one entry per copy it will deliver."""
    broker = redis_broker()
    return list(broker.client.lrange(f"{broker.namespace}:{queue_name}", 0, -1))


def commit_seconds(label: str) -> float:
    started = time.perf_counter()
    with transaction.atomic():
        send_on_commit(demo_pipeline, label)
    return time.perf_counter() - started


def wait_for_one_replica(settings: Any) -> None:
    # As Sentinel deployments ship: one replica must hold a message. 2 s for it to
    # say so rather than 50 ms: a loaded CI machine can delay the replica's answer
    # past 50 ms, and a row left unsent would fail a test about something else.
    # (Without a replica the primary gets no WAIT, so no test waits the 2 s.)
    settings.JOBS_OUTBOX_WAIT_REPLICAS = 1
    settings.JOBS_OUTBOX_WAIT_TIMEOUT_MS = 2000


def test_a_committed_request_is_published_and_marked_sent() -> None:
    with transaction.atomic():
        row = send_on_commit(demo_pipeline, "a")
        assert queued_messages("default") == []  # nothing before commit

    row.refresh_from_db()
    assert row.sent_at is not None
    [message] = queued_messages("default")
    assert message.message_id == row.message_id
    assert message.args == ("a",)


def test_a_rollback_leaves_nothing_to_send() -> None:
    def fail() -> None:
        with transaction.atomic():
            send_on_commit(demo_pipeline, "a")
            raise Boom

    with pytest.raises(Boom):
        fail()
    assert not OutboxMessage.objects.exists()
    assert relay_once() == 0
    assert queued_messages("default") == []


def test_concurrent_relays_publish_each_pending_row_once(settings) -> None:
    settings.JOBS_OUTBOX_GRACE_MS = 0
    # Rows as a commit that could not reach the broker leaves them.
    OutboxMessage.objects.bulk_create(
        OutboxMessage(
            message_id=message.message_id,
            actor_name=message.actor_name,
            queue_name=message.queue_name,
            payload=message.asdict(),
        )
        for message in (demo_pipeline.message(f"k{n}") for n in range(60))
    )
    barrier = threading.Barrier(4)
    published: list[int] = []

    def relay() -> None:
        barrier.wait()
        published.append(relay_once())
        connection.close()

    threads = [threading.Thread(target=relay) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sum(published) == 60
    ids = [m.message_id for m in queued_messages("default")]
    assert len(ids) == len(set(ids)) == 60
    assert not OutboxMessage.objects.filter(sent_at__isnull=True).exists()


def test_it_keeps_a_row_pending_until_a_replica_confirms_its_message(settings) -> None:
    # Given an outbox that waits for one replica, on a Redis that has none
    settings.JOBS_OUTBOX_WAIT_REPLICAS = 1
    settings.JOBS_OUTBOX_WAIT_TIMEOUT_MS = 50
    with transaction.atomic():
        row = send_on_commit(demo_pipeline, "unconfirmed")

    # Then the primary has the message, but the row is not marked sent: a
    # failover could still lose it, so the relay sends it again
    row.refresh_from_db()
    assert row.sent_at is None
    assert "ReplicationNotConfirmed" in row.last_error
    assert [m.message_id for m in queued_messages("default")] == [row.message_id]

    # And without the wait (no Sentinel, the default) the same row is sent at once
    settings.JOBS_OUTBOX_WAIT_REPLICAS = 0
    OutboxMessage.objects.filter(pk=row.pk).update(claimed_until=None)
    assert publish([row.pk]) == 1


def test_it_marks_an_unconfirmed_row_sent_once_the_ledger_saw_its_job_start(settings) -> None:
    # Given a row whose earlier publish was not confirmed by a replica
    settings.JOBS_OUTBOX_WAIT_REPLICAS = 1
    settings.JOBS_OUTBOX_WAIT_TIMEOUT_MS = 50
    with transaction.atomic():
        row = send_on_commit(demo_pipeline, "started")
    row.refresh_from_db()
    assert row.sent_at is None

    # When a worker has started that job and the relay comes back to the row
    ledger.flush()
    Job.objects.update_or_create(
        message_id=row.message_id,
        defaults={
            "actor_name": row.actor_name,
            "queue_name": row.queue_name,
            "state": states.RUNNING,
            "enqueued_at": timezone.now(),
            "started_at": timezone.now(),
        },
    )
    OutboxMessage.objects.filter(pk=row.pk).update(claimed_until=None)
    publish([row.pk])

    # Then the row is sent without a second copy of the message
    row.refresh_from_db()
    assert row.sent_at is not None
    assert len(queued_messages("default")) == 1


@pytest.mark.parametrize("argument", ["a\x00b", "\ud800", float("nan")])
def test_it_refuses_arguments_the_outbox_cannot_store_with_a_clear_error(argument) -> None:
    # PostgreSQL's jsonb refuses NUL; both databases refuse lone surrogates and NaN.
    # The caller gets a ValueError naming the problem, on every database, instead
    # of a DataError in its transaction, and nothing is written.
    with transaction.atomic(), pytest.raises(PayloadNotStorable, match="cannot store"):
        send_on_commit(demo_pipeline, argument)

    assert OutboxMessage.objects.count() == 0


def test_it_never_sends_a_message_twice_while_no_replica_confirms_it(settings) -> None:
    # Given a row whose message the primary took but no replica confirmed
    wait_for_one_replica(settings)
    with transaction.atomic():
        row = send_on_commit(demo_pipeline, "once")

    # When the relay comes back to it five times (15 s of backoff)
    for _ in range(5):
        relay_pass(row)

    # Then Redis holds one copy, a consumer gets it once, and the row still
    # waits for a replica (a failover could still lose the message)
    assert len(waiting_ids("default")) == 1
    consumer = redis_broker().consume("default", prefetch=10, timeout=200)
    delivered = []
    for message in consumer:
        if message is None:
            break
        delivered.append(message.message_id)
    consumer.close()
    assert delivered == [row.message_id]
    row.refresh_from_db()
    assert row.sent_at is None
    assert row.attempts == 6


def test_a_worker_runs_an_unconfirmed_message_once(settings, worker, attempts) -> None:
    # Given an unconfirmed row the relay came back to four times while workers were busy
    wait_for_one_replica(settings)
    worker.pause()
    with transaction.atomic():
        row = send_on_commit(demo_pipeline, "worker-once")
    for _ in range(4):
        relay_pass(row)

    # When the workers take the queue
    worker.resume()
    join("default")

    # Then the actor ran once
    assert [a[0] for a in attempts.attempts] == [row.message_id]


def test_a_delayed_unconfirmed_message_stays_one_copy(settings) -> None:
    # Given a message delayed by an hour (it cannot start, so the ledger never
    # settles its row) that no replica confirmed
    wait_for_one_replica(settings)
    with transaction.atomic():
        row = message_send_on_commit(demo_pipeline.message("later"), delay_ms=3_600_000)

    # When the relay comes back to it nine times
    for _ in range(9):
        relay_pass(row)

    # Then the delay queue holds one copy, due when it was asked to be
    broker = redis_broker()
    assert broker.client.hlen(f"{broker.namespace}:default.DQ.msgs") == 1


def test_it_sends_again_a_message_a_failover_lost(settings) -> None:
    # Given a row whose message no replica confirmed
    wait_for_one_replica(settings)
    with transaction.atomic():
        row = send_on_commit(demo_pipeline, "lost")

    # When the primary dies and Sentinel promotes a replica that never got it:
    # the new primary holds neither the message nor the outbox's marker
    redis_broker().client.flushdb()
    relay_pass(row)

    # Then the relay sends it again, once, and still waits for a replica
    assert [m.message_id for m in queued_messages("default")] == [row.message_id]
    assert len(waiting_ids("default")) == 1
    row.refresh_from_db()
    assert row.sent_at is None


def test_it_settles_the_row_once_a_replica_holds_the_message(
    settings, start_replica: Callable[[], Process]
) -> None:
    # Given a row published while the primary had no replica
    wait_for_one_replica(settings)
    with transaction.atomic():
        row = send_on_commit(demo_pipeline, "confirmed-later")
    row.refresh_from_db()
    assert row.sent_at is None

    # When a replica comes online and the relay comes back
    replica = start_replica()
    relay_pass(row)

    # Then the row is sent without a second copy, and the replica holds the
    # message (and its marker, which keeps a late copy from being enqueued)
    row.refresh_from_db()
    assert row.sent_at is not None
    assert len(waiting_ids("default")) == 1
    broker = redis_broker()
    on_replica = redis.Redis(port=replica.port)
    assert on_replica.hlen(f"{broker.namespace}:default.msgs") == 1


def test_a_commit_does_not_wait_for_a_replica_the_primary_does_not_have(settings) -> None:
    # Given the shipped WAIT timeout (500 ms) and a primary with no replica
    settings.JOBS_OUTBOX_WAIT_REPLICAS = 1
    settings.JOBS_OUTBOX_WAIT_TIMEOUT_MS = 500
    client = redis_broker().client
    assert client.info("replication")["connected_slaves"] == 0
    client.config_resetstat()

    # When requests commit rows that publish through the outbox
    took = [commit_seconds(f"fast{n}") for n in range(5)]

    # Then none waits for the timeout (no WAIT is sent: counted by Redis, as
    # wall-clock bounds fail on a loaded machine); the rows stay for the relay
    assert "cmdstat_wait" not in client.info("commandstats"), took
    assert max(took) < 0.5, took
    assert OutboxMessage.objects.filter(sent_at__isnull=True).count() == 5


def test_a_commit_waits_for_a_replica_that_keeps_up(
    settings, start_replica: Callable[[], Process]
) -> None:
    # Given a primary with a replica online
    wait_for_one_replica(settings)
    start_replica()

    # When a request commits a row that publishes through the outbox
    commit_seconds("confirmed")

    # Then the replica confirmed it in the same round trip: the row is sent
    assert OutboxMessage.objects.get().sent_at is not None


def test_a_commit_stops_waiting_for_a_replica_that_hangs(
    settings, start_replica: Callable[[], Process]
) -> None:
    # Given a replica that the primary lists online, but that hangs
    settings.JOBS_OUTBOX_WAIT_REPLICAS = 1
    settings.JOBS_OUTBOX_WAIT_TIMEOUT_MS = 300
    replica = start_replica()
    replica.process.send_signal(signal.SIGSTOP)
    client = redis_broker().client
    client.config_resetstat()

    # When requests commit rows that publish through the outbox
    took = [commit_seconds(f"hung{n}") for n in range(5)]

    # Then the first one waits the timeout, the next ones do not wait again
    # (one WAIT in all, counted by Redis: wall-clock bounds fail under load)
    assert took[0] >= 0.3, took
    assert client.info("commandstats")["cmdstat_wait"]["calls"] == 1, took
    assert OutboxMessage.objects.filter(sent_at__isnull=True).count() == 5


def test_the_default_without_sentinel_publishes_in_one_command(settings) -> None:
    # Given the single-Redis default: no replica to wait for
    assert settings.JOBS_OUTBOX_WAIT_REPLICAS == 0
    client = redis_broker().client
    client.config_resetstat()

    # When a request commits a row that publishes through the outbox
    commit_seconds("plain")

    # Then the publish was one script call (its marker written inside it, with
    # an hour's expiry), and it neither asked about replicas nor waited
    commands = client.info("commandstats")
    assert {"cmdstat_info", "cmdstat_wait", "cmdstat_del"}.isdisjoint(commands), commands
    assert commands["cmdstat_evalsha"]["calls"] == 1, commands
    row = OutboxMessage.objects.get()
    assert row.sent_at is not None
    assert 0 < client.pttl(f"{outbox.MARKER_PREFIX}{row.message_id}") <= 3_600_000
