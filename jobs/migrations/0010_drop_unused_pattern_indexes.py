"""Drop the four ``varchar_pattern_ops`` indexes Django adds on PostgreSQL.

Django gives every indexed or unique ``CharField`` a second, ``_like`` index for
``LIKE 'prefix%'`` queries. The ledger runs none (message ids are looked up
exactly, the admin's text search is ``icontains``, which no such index serves),
and every job's insert wrote all four: 4 of the 13 index entries per row of the
ledger's hottest table (issue 17). A no-op on SQLite, which has none. Reversible:
going back creates them again as Django would.

Both ways run ``CONCURRENTLY``, outside a transaction: a plain ``DROP INDEX``
takes an exclusive lock on ``jobs_job`` and waits behind any open transaction
that read it, and every ledger write and admin page queues behind that lock
for as long: a deploy would stall the workers. ``IF EXISTS`` and dropping
before creating make an interrupted run safe to run again.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

FIELDS = ("message_id", "actor_name", "queue_name", "retry_of")


def _like_indexes(apps: Any, schema_editor: Any) -> list[tuple[Any, Any, str]]:
    job = apps.get_model("jobs", "Job")
    table = job._meta.db_table
    return [
        (job, field, schema_editor._create_index_name(table, [field.column], suffix="_like"))
        for field in map(job._meta.get_field, FIELDS)
    ]


def drop(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for _, _, name in _like_indexes(apps, schema_editor):
        schema_editor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}")


def create(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for job, field, name in _like_indexes(apps, schema_editor):
        statement = schema_editor._create_like_index_sql(job, field)
        if statement is not None:
            # An interrupted CREATE INDEX CONCURRENTLY leaves an invalid index
            # behind: drop it first, so that running this again mends it.
            schema_editor.execute(
                f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(name)}"
            )
            sql = str(statement).replace("CREATE INDEX", "CREATE INDEX CONCURRENTLY", 1)
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    # CONCURRENTLY cannot run inside a transaction block
    atomic = False

    dependencies = [("jobs", "0009_job_references")]

    operations = [migrations.RunPython(drop, create, elidable=False)]
