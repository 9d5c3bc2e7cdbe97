"""The upsert's short way of preparing column values stores what Django's stores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS, DataError, connections, transaction
from django.db.backends.base.operations import BaseDatabaseOperations

from jobs.ledger.upsert import _plan, _preparers, batch_cursor
from jobs.models import Job

pytestmark = pytest.mark.django_db

# What the middleware puts in a job's columns, of every type the short way takes.
SAMPLES: list[Any] = [
    None,
    "",
    "text with \ufffd and é",
    0,
    7,
    10**12,
    datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-5))),
    datetime(2026, 1, 2, 3, 4, 5),  # naive: Django's own way, warning included
    True,
    2.5,
    [],
    [1, 2.5, "x", None, {"nested": [True]}],
    {},
    {"key": "value", "n": 1},
]


def _as_stored(field: Any, value: Any) -> Any:
    """What the column holds for the parameter ``value``.

    On SQLite the parameter itself (and its type), which the short way must
    match exactly. On PostgreSQL the short way may send another Python type
    (a plain int for Django's ``Int4``, JSON text for its ``Jsonb``), so the
    server casts the parameter to the column's type, through the cursor the
    upsert writes with, and says what it got.
    """
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.vendor != "postgresql":
        return (type(value), value)
    try:
        with transaction.atomic(), batch_cursor(conn) as cursor:
            cursor.execute(f"SELECT CAST(%s AS {field.db_type(conn)})::text", [value])
            return cursor.fetchone()[0]
    except DataError as exc:
        return type(exc.__cause__)


def _in_range(field: Any, value: Any) -> bool:
    # The writer lowers an int above its column's range before preparing it
    # (storable_columns): 10**12 only ever reaches a bigint column.
    ranges = BaseDatabaseOperations.integer_field_ranges
    if type(value) is not int or field.get_internal_type() not in ranges:
        return True
    low, high = ranges[field.get_internal_type()]
    return low <= value <= high


@pytest.mark.filterwarnings("ignore:DateTimeField .* received a naive datetime")
def test_it_prepares_each_column_value_to_store_what_django_stores() -> None:
    # Given the job columns the upsert writes, and Django's own preparation
    conn = connections[DEFAULT_DB_ALIAS]
    conn.ensure_connection()
    fields = [f for f in Job._meta.concrete_fields if not f.primary_key]
    preparers = _preparers(fields, conn)
    for field, known in zip(fields, preparers, strict=True):
        for value in SAMPLES:
            prepare = known.get(type(value))
            if prepare is None or not _in_range(field, value):
                continue
            # When a value of a type the short way takes is prepared
            expected = _as_stored(field, field.get_db_prep_save(value, conn))
            # Then the column gets exactly what Django's preparation gives it
            assert _as_stored(field, prepare(value)) == expected, (field.name, value)
    # (and every column but the foreign key has a short way for its values)
    short = {f.attname for f, known in zip(fields, preparers, strict=True) if len(known) > 1}
    assert {f.attname for f in fields} - short == {"retry_of_id"}


def _outcome(prepare: Any, value: Any) -> Any:
    try:
        return prepare(value)
    except ValueError as exc:  # SQLite refuses an aware value without USE_TZ
        return ValueError, str(exc)


def test_a_plan_made_before_use_tz_changed_is_made_again(settings: Any) -> None:
    # Given the connection's plan, made with the shipped USE_TZ
    conn = connections[DEFAULT_DB_ALIAS]
    conn.ensure_connection()
    before = _plan(conn)
    field = Job._meta.get_field("started_at")
    index = before.position["started_at"]
    value = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    # When a test turns USE_TZ off (the writer's short way decided it once)
    settings.USE_TZ = False
    after = _plan(conn)
    # Then the next batch's plan prepares datetimes as Django now does
    assert after is not before
    expected = _outcome(lambda v: field.get_db_prep_save(v, conn), value)
    assert _outcome(after.preparers[index][datetime], value) == expected
