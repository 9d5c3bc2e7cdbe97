"""A database that answers but refuses writes keeps the ledger's events (and so
their acks), and bad events at the head of a batch cost only themselves.

Issue 29, items 1 and 2. The refusal is the database's own: SQLite's
``PRAGMA query_only`` ("attempt to write a readonly database") and PostgreSQL's
``default_transaction_read_only`` (SQLSTATE 25006, a demoted primary or a
maintenance window), set on the connection that writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
from django.db import (
    DataError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    connection,
)

from jobs.ledger import writer as ledger
from jobs.ledger.writer import TERMINAL, DatabaseUnreachable, Event
from jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


def event(message_id: str, **create: object) -> Event:
    fields = {"actor_name": "a", "queue_name": "q", "enqueued_at": datetime.now(UTC), **create}
    return Event(message_id, "succeeded", TERMINAL, fields, {"duration_ms": 1})


@contextmanager
def writes_refused() -> Iterator[None]:
    with connection.cursor() as cursor:
        if connection.vendor == "sqlite":
            cursor.execute("PRAGMA query_only = ON")
        else:
            cursor.execute("SET default_transaction_read_only = on")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "sqlite":
                cursor.execute("PRAGMA query_only = OFF")
            else:
                cursor.execute("SET default_transaction_read_only = off")


def test_a_batch_refused_by_a_read_only_database_is_kept_not_given_up() -> None:
    events = [event(f"ro-{n}") for n in range(20)]
    failures = ledger.stats.write_failures

    with writes_refused(), pytest.raises(DatabaseUnreachable):
        # The intake's and the batch writer's path: raising keeps the entries
        # (and the held acks) for the next try.
        ledger.write_now(events)

    assert Job.objects.count() == 0
    assert ledger.stats.write_failures == failures  # nothing counted as lost
    # Once the database takes writes again, the same events are written.
    ledger.write_now(events)
    assert Job.objects.filter(state="succeeded").count() == 20


def test_three_bad_events_at_the_head_of_a_batch_cost_only_themselves() -> None:
    # max_attempts below zero breaks its CHECK constraint (a message sent with
    # max_retries=-2), on SQLite and on PostgreSQL.
    bad = [event(f"bad-{n}", max_attempts=-1) for n in range(3)]
    good = [event(f"good-{n}") for n in range(20)]
    failures = ledger.stats.write_failures

    ledger.write_now(bad + good)

    assert Job.objects.filter(message_id__startswith="good-").count() == 20
    assert ledger.stats.write_failures - failures == 3
    # The bad ones are recorded too, with their state and what was refused:
    # a job that ran is never missing from the ledger.
    bad_rows = Job.objects.filter(message_id__startswith="bad-")
    assert (
        sorted(bad_rows.values_list("state", "error_type"))
        == [("succeeded", ledger.VALUES_REFUSED)] * 3
    )
    assert "only its state is recorded" in bad_rows[0].error_message


def test_a_job_alone_in_its_batch_whose_values_are_refused_is_recorded_with_its_state() -> None:
    ledger.write_now([event("alone", max_attempts=-1, args=["secret-ish"])])

    row = Job.objects.get(message_id="alone")
    assert (row.state, row.error_type, row.args) == ("succeeded", ledger.VALUES_REFUSED, [])
    assert "secret-ish" not in row.error_message


def test_a_refusal_in_the_middle_of_a_split_batch_keeps_the_whole_batch() -> None:
    # One bad event splits the batch job by job; the database then refuses
    # writes for another reason: the rest is kept, not counted lost one by one.
    events = [event("bad", max_attempts=-1), *(event(f"later-{n}") for n in range(5))]
    failures = ledger.stats.write_failures

    with writes_refused(), pytest.raises(DatabaseUnreachable):
        ledger.write_now(events)

    assert ledger.stats.write_failures == failures
    ledger.write_now(events)
    assert Job.objects.filter(message_id__startswith="later-").count() == 5


@pytest.mark.parametrize(
    ("error", "events_fault"),
    [
        (IntegrityError("CHECK constraint failed"), True),
        (DataError("value too long"), True),
        (OverflowError("int too large to convert to SQLite INTEGER"), True),
        (OperationalError("cannot execute INSERT in a read-only transaction"), False),
        (InterfaceError("the connection is closed"), False),  # not a DatabaseError
        (ProgrammingError('relation "jobs_job" does not exist'), False),
    ],
)
def test_only_integrity_and_data_errors_are_the_events_fault(
    error: Exception, events_fault: bool
) -> None:
    assert ledger.caused_by_events(error) is events_fault
