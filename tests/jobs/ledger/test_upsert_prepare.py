"""The upsert's short way of preparing column values gives what Django's gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import DEFAULT_DB_ALIAS, connections

from jobs.ledger.upsert import _preparers
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
    [],
    [1, 2.5, "x", None, {"nested": [True]}],
    {},
    {"key": "value", "n": 1},
]


def _as_sent(value: Any) -> Any:
    """The parameter as the driver gets it (PostgreSQL wraps ints and JSON)."""
    conn = connections[DEFAULT_DB_ALIAS]
    if conn.vendor == "postgresql":
        ops: Any = conn.ops  # PostgreSQL's own: its literal, as a client-side cursor sends it
        return (type(value), ops.compose_sql("%s", [value]))
    return (type(value), value)


@pytest.mark.filterwarnings("ignore:DateTimeField .* received a naive datetime")
def test_it_prepares_each_column_value_as_django_does() -> None:
    # Given the job columns the upsert writes, and Django's own preparation
    conn = connections[DEFAULT_DB_ALIAS]
    conn.ensure_connection()
    fields = [f for f in Job._meta.concrete_fields if not f.primary_key]
    preparers = _preparers(fields, conn)
    for field, known in zip(fields, preparers, strict=True):
        for value in SAMPLES:
            prepare = known.get(type(value))
            if prepare is None:
                continue
            # When a value of a type the short way takes is prepared
            expected = _as_sent(field.get_db_prep_save(value, conn))
            # Then it goes to the database exactly as Django would send it
            assert _as_sent(prepare(value)) == expected, (field.name, value)
    # (and every column but the foreign key has a short way for its values)
    short = {f.attname for f, known in zip(fields, preparers, strict=True) if len(known) > 1}
    assert {f.attname for f in fields} - short == {"retry_of_id"}
