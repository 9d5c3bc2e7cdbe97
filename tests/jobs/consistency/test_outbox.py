"""The outbox: written with the transaction, published after commit, once per row."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from jobs.consistency.outbox import relay_once, send_on_commit
from jobs.models import OutboxMessage
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
