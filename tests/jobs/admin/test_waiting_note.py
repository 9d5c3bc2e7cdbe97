"""The job pages' "waiting for order:42" note (``jobs.admin.waiting``) and the
database's write lock."""

from __future__ import annotations

import uuid

import pytest
from django.db import transaction
from django.utils import timezone

from jobs.admin import waiting
from jobs.broker import redis_broker
from jobs.ledger import states
from jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def hmget_calls() -> int:
    stats = redis_broker().client.info("commandstats")
    return int(stats.get("cmdstat_hmget", {}).get("calls", 0))


def test_the_note_asks_redis_nothing_inside_a_transaction() -> None:
    # Django's admin runs a delete or change POST in one transaction, which on
    # SQLite holds the database's only write lock: a Redis read there (up to
    # the 0.75 s timeout of a hung server) held every worker's writes with it.
    job = Job.objects.create(
        message_id=str(uuid.uuid4()),
        actor_name="x",
        queue_name="q",
        enqueued_at=timezone.now(),
        state=states.ENQUEUED,
    )
    before = hmget_calls()

    with transaction.atomic():
        waiting.note_waiting([job])

    assert hmget_calls() == before
    assert job.waiting_for == ""  # type: ignore[attr-defined]
    waiting.note_waiting([job])  # outside one, it asks
    assert hmget_calls() == before + 1
