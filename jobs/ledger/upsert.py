"""The ledger's SQL per batch: a forward-only, race-free upsert, and the jobs' references."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper

from jobs.conf import jobs_settings
from jobs.ledger.states import FAILED, RUNNING, SUCCEEDED

if TYPE_CHECKING:
    from jobs.ledger.writer import Event

Prepare = Callable[[Any], Any]
_INTEGER_FIELDS = (
    models.IntegerField,
    models.BigIntegerField,
    models.PositiveIntegerField,
    models.PositiveBigIntegerField,
)

# What the watchdog writes with an end it guessed (a finished state below
# TERMINAL, jobs.scheduling.watchdog), as SQL for the column's default: the
# message's next event shows the guess wrong, and its note goes with it.
_GUESS_NOTES = {"error_type": "''", "error_message": "''", "finished_at": "NULL"}


def _same(value: Any) -> Any:
    return value


def _preparers(
    fields: list[models.Field[Any, Any]], conn: BaseDatabaseWrapper
) -> list[dict[type, Prepare]]:
    """Per column, by a value's exact type, what ``get_db_prep_save`` comes down to.

    ``get_db_prep_save`` walks four or five methods per value (and the thread
    local connection proxy) to return, for the values the ledger writes, the
    value itself or one backend adaptation; the writer thread pays that for
    every column of every job while the worker threads wait for the GIL. Only
    Django's own field classes and the types the middleware sends take the
    short way (a subclass or any other type takes Django's), and
    tests/jobs/ledger/test_upsert_prepare.py checks that each stores what
    Django's would.

    On PostgreSQL two take a shorter way than Django's: an int goes as itself
    (``batch_cursor`` binds every int as bigint, and the column casts it),
    not wrapped in a psycopg ``Int4``/``Int8`` object; and JSON goes as its
    text, which the jsonb column parses as it parses ``Jsonb``'s, so an empty
    list or dict is encoded once rather than by psycopg for every row (about
    10 us of the writer thread per job between them, issue 17).
    """
    ops = conn.ops
    postgres = conn.vendor == "postgresql"
    found: list[dict[type, Prepare]] = []
    for field in fields:
        # None is None for each of these classes (SQL NULL).
        known: dict[type, Prepare] = {type(None): _same}
        kind = type(field)
        if kind in (models.CharField, models.TextField):
            known[str] = _same  # to_python(str) is the str; no backend adaptation
        elif kind in _INTEGER_FIELDS:
            if postgres:
                known[int] = _same
            else:
                known[int] = _integer(ops.adapt_integerfield_value, field.get_internal_type())
        elif kind is models.DateTimeField:
            known[datetime] = _datetime(ops.adapt_datetimefield_value, field, conn)
        elif kind is models.JSONField and isinstance(field, models.JSONField):  # (typing)
            if postgres:
                # Every JSON value as text, scalars too (a return value), so
                # the column's parameter has one type whatever the job returned.
                prepare = _json(_json_text, field.encoder)
                for scalar in (str, int, float, bool, dict, list):
                    known[scalar] = prepare
            else:
                known[dict] = known[list] = _json(ops.adapt_json_value, field.encoder)
        else:
            known = {}
        found.append(known)
    return found


def _integer(adapt: Callable[[Any, str], Any], internal_type: str) -> Prepare:
    return lambda value: adapt(value, internal_type)  # int(value) is the value


def _datetime(adapt: Prepare, field: models.Field[Any, Any], conn: BaseDatabaseWrapper) -> Prepare:
    if conn.vendor == "sqlite" and settings.USE_TZ:
        # What SQLite's adapt_datetimefield_value comes down to for an aware
        # value: its text in the connection's time zone. Taken straight, not
        # through the settings and timezone helpers it reads per value (three
        # datetimes a row, in the writer thread: issue 17).
        zone = conn.timezone

        def adapt(value: datetime) -> Any:
            return str(value.astimezone(zone).replace(tzinfo=None))

    def prepare(value: datetime) -> Any:
        if value.utcoffset() is None:  # naive: Django warns and makes it aware
            return field.get_db_prep_save(value, conn)
        return adapt(value)

    return prepare


def _json_text(value: Any, encoder: Any) -> str:
    # What Django's Jsonb wrapper has psycopg send (get_json_dumps), as a str:
    # a parameter of no declared type, which the jsonb column parses.
    return json.dumps(value, cls=encoder)


def _json(adapt: Callable[[Any, Any], Any], encoder: Any) -> Prepare:
    # An empty list or dict (a job sent without arguments or options) is
    # written for most rows: adapted once, where that makes it a str.
    empty: dict[type, Any] = {}
    for kind in (list, dict):
        adapted = adapt(kind(), encoder)
        if type(adapted) is str:
            empty[kind] = adapted

    def prepare(value: Any) -> Any:
        if not value and type(value) in empty:
            return empty[type(value)]
        return adapt(value, encoder)

    return prepare


def _prepare(
    field: models.Field[Any, Any], known: dict[type, Prepare], value: Any, conn: BaseDatabaseWrapper
) -> Any:
    prepare = known.get(type(value))
    return field.get_db_prep_save(value, conn) if prepare is None else prepare(value)


@contextmanager
def batch_cursor(conn: BaseDatabaseWrapper, *, prepared: bool = True) -> Iterator[CursorWrapper]:
    """A cursor for the ledger's ``executemany`` statements.

    On PostgreSQL, one that binds parameters on the server and prepares each
    statement once per connection, where Django's default cursor composes the
    query text of every row in the client (quoting each value, in the writer
    thread that shares the GIL with the worker threads) and has the server
    parse and plan that text again for each row: measured at 42 jobs a batch,
    about 100 us of server CPU and 15 us of client CPU per job. Only these
    statements are prepared (``executemany`` asks for it; the connection's
    threshold stays as Django set it for everything else), so
    ``JOBS_LEDGER_PREPARED=0`` is only needed behind a pooler that cannot
    keep prepared statements: PgBouncer in transaction mode before 1.22 (psycopg
    sends DEALLOCATE ALL after a rollback) or with max_prepared_statements = 0.
    Elsewhere, Django's own cursor. With ``prepared=False``, bound on the
    server but never prepared, even where the connection's OPTIONS set a
    ``prepare_threshold`` (for a statement whose best plan changes as the
    table grows).
    """
    if conn.vendor != "postgresql" or not jobs_settings.JOBS_LEDGER_PREPARED:
        with conn.cursor() as cursor:
            yield cursor
        return
    from django.db.backends.postgresql import base
    from psycopg.types.numeric import Int8Dumper

    conn.ensure_connection()
    pg = conn.connection
    with conn.wrap_database_errors:
        # (django-stubs have this class without psycopg's constructor)
        raw: Any = base.ServerBindingCursor(pg)  # type: ignore[call-arg]
    # Every int as bigint: psycopg would send the smallest type that fits, and
    # each mix of types is a statement prepared apart.
    raw.adapters.register_dumper(int, Int8Dumper)
    threshold = pg.prepare_threshold
    if not prepared:  # whatever the connection's OPTIONS say
        pg.prepare_threshold = None
    elif threshold is None:  # Django's default: never; executemany's own prepare still counts
        pg.prepare_threshold = _NEVER_BY_COUNT
    try:
        with conn.make_debug_cursor(raw) if conn.queries_logged else conn.make_cursor(raw) as c:
            yield c
    finally:
        pg.prepare_threshold = threshold


# A threshold no statement's count reaches: only those executed with
# ``prepare=True`` (as executemany's are) are prepared.
_NEVER_BY_COUNT = 2**62


class _Plan:
    """What ``upsert`` needs of one connection that no batch changes: the
    columns, their prepared defaults and short ways, and each statement text
    built so far (by the columns a batch updates, and those every event sets).
    Built once: at a few dozen jobs a batch, building them again was a fair
    part of the writer's CPU per job."""

    def __init__(self, conn: BaseDatabaseWrapper) -> None:
        from jobs.models import Job

        self.fields = [f for f in Job._meta.concrete_fields if not f.primary_key]
        self.position = {f.attname: i for i, f in enumerate(self.fields)}
        self.preparers = _preparers(self.fields, conn)
        # Through the short way where there is one, so a column's parameter
        # has the same type whether the event set it or not (on PostgreSQL
        # each mix of types is a statement prepared apart).
        self.prepared_defaults = [
            _prepare(field, known, field.get_default(), conn)
            for field, known in zip(self.fields, self.preparers, strict=True)
        ]
        self.table = Job._meta.db_table
        # What the preparers were made for (SQLite's datetimes differ by it).
        self.use_tz = settings.USE_TZ
        self.statements: dict[tuple[tuple[str, ...], frozenset[str]], str] = {}


_STATEMENTS_KEPT = 64
# Kept on the connection wrapper itself: the plan's preparers hold the wrapper
# (its ops' bound methods), so a dict keyed by the wrapper, even a weak one,
# would keep every thread's wrapper and its open connection alive for good.
_PLAN_ATTRIBUTE = "_jobs_ledger_plan"


def _plan(conn: BaseDatabaseWrapper) -> _Plan:
    plan: _Plan | None = getattr(conn, _PLAN_ATTRIBUTE, None)
    # Made again if USE_TZ changed since (a test's override): Django's own
    # preparation reads it for every value.
    if plan is None or plan.use_tz != settings.USE_TZ:
        plan = _Plan(conn)
        setattr(conn, _PLAN_ATTRIBUTE, plan)
    return plan


def _statement(
    conn: BaseDatabaseWrapper, plan: _Plan, updated: list[str], everywhere: set[str]
) -> str:
    quote = conn.ops.quote_name
    table = quote(plan.table)
    columns = ", ".join(quote(f.attname) for f in plan.fields)  # no db_column overrides here
    placeholders = ", ".join(["%s"] * len(plan.fields))

    def old(name: str) -> str:
        return f"{table}.{quote(name)}"

    def new(name: str) -> str:
        return f"excluded.{quote(name)}"

    def greatest(a: str, b: str) -> str:
        return f"CASE WHEN {a} > {b} THEN {a} ELSE {b} END"

    assignments = [f"{quote(name)} = {new(name)}" for name in ("state", "progress")]
    # Only a row below TERMINAL is updated: a finished state there is a guess.
    guessed = f"{old('state')} IN ('{FAILED}', '{SUCCEEDED}')"
    for name, default in _GUESS_NOTES.items():
        if name not in updated:
            assignments.append(
                f"{quote(name)} = CASE WHEN {guessed} THEN {default} ELSE {old(name)} END"
            )
    for name in updated:
        if name == "attempts":
            # Each delivery that starts is one more attempt, including a
            # redelivery after a crash (the same start again, elsewhere), which
            # Dramatiq's retry count misses; a delivery that resumes a deferred
            # attempt is not. Parameters: sets attempts, start's progress, resumes.
            attempts = old("attempts")
            redelivered = (
                f"{old('state')} = '{RUNNING}' AND {old('progress')} = %s "
                f"AND {old('started_at')} <> {new('started_at')}"
            )
            assignments.append(
                f"{quote(name)} = CASE WHEN NOT %s THEN {attempts} "
                f"WHEN {redelivered} THEN {attempts} + 1 "
                f"WHEN %s THEN {greatest(attempts, new(name))} "
                f"ELSE {greatest(f'{attempts} + 1', new(name))} END"
            )
        elif name in everywhere:
            assignments.append(f"{quote(name)} = {new(name)}")
        else:
            kept = old(name)
            if name in _GUESS_NOTES:
                kept = f"CASE WHEN {guessed} THEN {_GUESS_NOTES[name]} ELSE {kept} END"
            assignments.append(f"{quote(name)} = CASE WHEN %s THEN {new(name)} ELSE {kept} END")

    # Forward only; or the same attempt started again elsewhere (a redelivery).
    condition = (
        f"{old('progress')} < {new('progress')} OR ({old('state')} = '{RUNNING}' AND "
        f"{old('progress')} = {new('progress')} AND {old('started_at')} <> {new('started_at')})"
    )
    return (
        f"INSERT INTO {table} ({columns}) VALUES ({placeholders}) "
        f"ON CONFLICT ({quote('message_id')}) DO UPDATE SET {', '.join(assignments)} "
        f"WHERE {condition}"
    )


def upsert(events: list[Event]) -> None:
    """One ``INSERT .. ON CONFLICT DO UPDATE .. WHERE progress < new`` for the batch.

    The conditional upsert is what keeps the ledger forward-only and race-free
    across processes (SQLite >= 3.24 and PostgreSQL both support it): a new row
    is inserted whole, an existing one only moves forward. Rows go in
    message-id order, whatever columns each event updates (a column an event
    does not set keeps its value through a per-row flag), so every writer
    locks rows in the same order and two batches can never deadlock.
    """
    # The thread's own connection, not the proxy: each attribute read through
    # ``django.db.connection`` is a thread-local lookup.
    conn = connections[DEFAULT_DB_ALIAS]
    plan = _plan(conn)
    fields, position, preparers = plan.fields, plan.position, plan.preparers
    prepared_defaults = plan.prepared_defaults
    updated = sorted({name for event in events for name in event.update})
    everywhere = {name for name in updated if all(name in e.update for e in events)}
    key = (tuple(updated), frozenset(everywhere))
    sql = plan.statements.get(key)
    if sql is None:
        if len(plan.statements) >= _STATEMENTS_KEPT:  # (a handful in practice)
            plan.statements.clear()
        sql = plan.statements[key] = _statement(conn, plan, updated, everywhere)
    rows = []
    for event in sorted(events, key=lambda e: e.message_id):
        # Start from the prepared defaults and prepare only what the event
        # sets: this loop runs for every event, in the writer thread that
        # shares the GIL with the worker threads.
        row = list(prepared_defaults)
        values = {**event.create, **event.update}
        values.update(message_id=event.message_id, state=event.state, progress=event.progress)
        for name, value in values.items():
            index = position[name]
            prepare = preparers[index].get(type(value))
            if prepare is None:
                row[index] = fields[index].get_db_prep_save(value, conn)
            else:
                row[index] = prepare(value)
        for name in updated:
            if name == "attempts":
                row += ["attempts" in event.update, event.started_progress, event.resumes]
            elif name not in everywhere:
                row.append(name in event.update)
        rows.append(row)
    with batch_cursor(conn) as cursor:
        cursor.executemany(sql, rows)


def annotate(events: list[Event], terminal: int) -> int:
    """Write each event's ``annotate`` columns unless its job reached ``terminal``;
    the number of statements it took.

    One UPDATE per set of columns (in practice one: the error columns), sent
    with ``executemany`` in message-id order, rather than one ORM ``update()``
    per event: building and compiling a queryset per failed job was most of
    what the writer spent on a batch of failures.
    """
    from jobs.models import Job

    conn = connections[DEFAULT_DB_ALIAS]
    concrete = {f.name: f for f in Job._meta.concrete_fields}
    below = concrete["progress"].get_db_prep_save(terminal, conn)
    groups: dict[tuple[str, ...], list[list[Any]]] = {}
    for event in sorted(events, key=lambda e: e.message_id):
        if not event.annotate or event.progress >= terminal:
            continue
        fields = [(concrete[name], value) for name, value in event.annotate.items()]
        row = [field.get_db_prep_save(value, conn) for field, value in fields]
        # (attnames are the columns: no db_column overrides here)
        groups.setdefault(tuple(field.attname for field, _ in fields), []).append(
            [*row, event.message_id, below]
        )
    if not groups:
        return 0
    quote = conn.ops.quote_name
    with batch_cursor(conn) as cursor:
        for columns, rows in groups.items():
            cursor.executemany(
                f"UPDATE {quote(Job._meta.db_table)} "
                f"SET {', '.join(f'{quote(column)} = %s' for column in columns)} "
                f"WHERE {quote('message_id')} = %s AND {quote('progress')} < %s",
                rows,
            )
    return len(groups)


def insert_references(events: list[Event]) -> bool:
    """Store the subjects of ``events`` as JobReference rows; whether there were any.

    Run after ``upsert`` in its transaction, so each job's row exists. Every
    event of a job carries its subjects (any of them may be the one that creates
    the row), and a subject stored before is skipped by the unique constraint.
    """
    from jobs.models import Job, JobReference

    rows = sorted({(e.message_id, subject) for e in events for subject in e.subjects})
    if not rows:
        return False
    quote = connection.ops.quote_name
    # The WHERE also settles SQLite's INSERT .. SELECT .. ON CONFLICT ambiguity.
    sql = (
        f"INSERT INTO {quote(JobReference._meta.db_table)} ({quote('job_id')}, {quote('subject')}) "
        f"SELECT {quote('id')}, %s FROM {quote(Job._meta.db_table)} "
        f"WHERE {quote('message_id')} = %s ON CONFLICT DO NOTHING"
    )
    with batch_cursor(connections[DEFAULT_DB_ALIAS]) as cursor:
        cursor.executemany(sql, [(subject, message_id) for message_id, subject in rows])
    return True
