"""The outbox: written with the transaction, published after commit, once per row."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction
from django.utils import timezone

from jobs.consistency.outbox import PayloadNotStorable, publish, relay_once, send_on_commit
from jobs.ledger import states
from jobs.ledger import writer as ledger
from jobs.models import Job, OutboxMessage
from tests.conftest import queued_messages
from tests.examples.tasks import demo_pipeline

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


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
