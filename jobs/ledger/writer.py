"""Record job events in the database: the write side of the job ledger.

Every Dramatiq hook becomes an ``Event``. ``record()`` writes it at once when
``JOBS_LEDGER_FLUSH_MS`` is 0, otherwise hands it to a per-process background
writer that merges the events of each flush into one transaction. A job's end
(success, failure or skip) is written before the worker acks the message (the
worker thread waits, group-commit style, with every other thread finishing
then), so a killed worker never leaves a finished job unrecorded. Writes are
ordered by ``progress``:

    progress = attempt_index * 10 + phase      phase: delayed 1, enqueued 2, running 3
    progress = TERMINAL for succeeded, failed and skipped

and applied by a conditional upsert (``progress < new``), so events may arrive
late, twice, or from several processes in any order without moving a job
backwards. A failing write is logged and counted, never raised: the ledger must
not break the job it records.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction

from jobs.ledger.states import RUNNING
from jobs.observability import metrics

logger = logging.getLogger(__name__)

PHASE_DELAYED, PHASE_ENQUEUED, PHASE_RUNNING = 1, 2, 3
TERMINAL = 10**12


def progress_of(attempt_index: int, phase: int) -> int:
    return attempt_index * 10 + phase


@dataclass
class Event:
    """One state change of one message.

    ``create`` holds the columns a new row needs (identity, arguments, times);
    ``update`` the columns this event moves forward.
    """

    message_id: str
    state: str
    progress: int
    create: dict[str, Any]
    update: dict[str, Any] = field(default_factory=dict)
    failure: dict[str, Any] | None = None
    # Columns written whatever the progress, unless the job is already terminal
    # (the last error of an attempt that will be retried).
    annotate: dict[str, Any] = field(default_factory=dict)


@dataclass
class Stats:
    """Per-process ledger counters (exported as metrics)."""

    events: int = 0
    writes: int = 0
    statements: int = 0
    write_failures: int = 0


stats = Stats()


def _merge(events: list[Event]) -> tuple[list[Event], list[dict[str, Any]]]:
    """One event per message (the furthest one, carrying every field seen) + failures."""
    merged: dict[str, Event] = {}
    failures: list[dict[str, Any]] = []
    for event in sorted(events, key=lambda e: e.progress):
        if event.failure is not None:
            failures.append({"job_id": event.message_id, **event.failure})
        current = merged.get(event.message_id)
        if current is None:
            merged[event.message_id] = Event(
                event.message_id,
                event.state,
                event.progress,
                dict(event.create),
                dict(event.update),
                annotate=dict(event.annotate),
            )
        else:
            current.state, current.progress = event.state, event.progress
            current.update.update(event.update)
            current.annotate.update(event.annotate)
            for key, value in event.create.items():
                current.create.setdefault(key, value)
    return list(merged.values()), failures


def _upsert(events: list[Event]) -> None:
    """One ``INSERT .. ON CONFLICT DO UPDATE .. WHERE progress < new`` per event shape.

    The conditional upsert is what keeps the ledger forward-only and race-free
    across processes (SQLite >= 3.24 and PostgreSQL both support it): a new row
    is inserted whole, an existing one only moves forward. Events are grouped by
    the columns they update so each group is one ``executemany``.
    """
    from jobs.models import Job

    fields = [f for f in Job._meta.concrete_fields if not f.primary_key]
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    columns = ", ".join(quote(f.attname) for f in fields)  # no db_column overrides here
    placeholders = ", ".join(["%s"] * len(fields))
    position = {f.attname: i for i, f in enumerate(fields)}
    prepared_defaults = [f.get_db_prep_save(f.get_default(), connection) for f in fields]
    groups: dict[tuple[str, ...], list[Event]] = {}
    for event in events:
        groups.setdefault(tuple(sorted(event.update)), []).append(event)

    def assign(name: str) -> str:
        column, new = f"{table}.{quote(name)}", f"excluded.{quote(name)}"
        if name == "attempts":
            # Each delivery that starts is one more attempt, including a
            # redelivery after a crash, which Dramatiq's retry count misses.
            return (
                f"{quote(name)} = CASE WHEN {column} + 1 > {new} THEN {column} + 1 ELSE {new} END"
            )
        return f"{quote(name)} = {new}"

    progress, state, started = (f"{table}.{quote(c)}" for c in ("progress", "state", "started_at"))
    # Forward only; or the same attempt started again elsewhere (a redelivery).
    new_progress, new_started = f"excluded.{quote('progress')}", f"excluded.{quote('started_at')}"
    condition = (
        f"{progress} < {new_progress} OR ({state} = '{RUNNING}' AND "
        f"{progress} = {new_progress} AND {started} <> {new_started})"
    )
    with connection.cursor() as cursor:
        for updated, group in groups.items():
            assignments = ", ".join(assign(name) for name in ("state", "progress", *updated))
            sql = (
                f"INSERT INTO {table} ({columns}) VALUES ({placeholders}) "
                f"ON CONFLICT ({quote('message_id')}) DO UPDATE SET {assignments} "
                f"WHERE {condition}"
            )
            rows = []
            for event in group:
                # Start from the prepared defaults and prepare only what the
                # event sets: this loop runs for every event, in the writer thread
                # that shares the GIL with the worker threads.
                row = list(prepared_defaults)
                values = {**event.create, **event.update}
                values.update(
                    message_id=event.message_id, state=event.state, progress=event.progress
                )
                for name, value in values.items():
                    index = position[name]
                    row[index] = fields[index].get_db_prep_save(value, connection)
                rows.append(row)
            cursor.executemany(sql, rows)
            stats.statements += 1


def _redeliveries(merged: list[Event]) -> list[dict[str, Any]]:
    """Attempts that started again without finishing: one failure row each.

    An event that starts attempt *n* while the ledger shows attempt *n* running
    since another time means the broker delivered the message again: its worker
    died (or the message was sent twice). Only rows in state running are read.
    """
    from jobs.models import Job

    starting = {e.message_id: e for e in merged if "started_at" in e.update}
    if not starting:
        return []
    stats.statements += 1
    rows = Job.objects.filter(message_id__in=list(starting), state=RUNNING).values(
        "message_id", "progress", "attempts", "started_at", "worker_host", "worker_pid"
    )
    failures = []
    for row in rows:
        event = starting[row["message_id"]]
        same_attempt = row["progress"] // 10 == int(event.update.get("attempts", 1)) - 1
        if same_attempt and row["started_at"] != event.update["started_at"]:
            failures.append(
                {
                    "job_id": row["message_id"],
                    "number": row["attempts"],
                    "started_at": row["started_at"],
                    "finished_at": event.update["started_at"],
                    "worker_host": row["worker_host"],
                    "worker_pid": row["worker_pid"],
                    "error_type": "WorkerLost",
                    "error_message": "did not finish: the broker delivered the message again "
                    "(its worker stopped, or the message was sent twice)",
                }
            )
    return failures


def _renumber(failures: list[dict[str, Any]]) -> None:
    """Number failed attempts by the ledger's attempt count, not Dramatiq's.

    The middleware numbers a failure ``retries + 1``; after a redelivery the
    ledger counts one attempt more than Dramatiq does, so shift each job's
    failures up to end at its current attempt count (else the lost attempt's row
    and this one would share a number and one would be dropped).
    """
    from jobs.models import Job

    ids = {f["job_id"] for f in failures}
    attempts = dict(Job.objects.filter(message_id__in=ids).values_list("message_id", "attempts"))
    for job_id in ids:
        own = [f for f in failures if f["job_id"] == job_id]
        shift = max(0, attempts.get(job_id, 0) - max(f["number"] for f in own))
        for failure in own:
            failure["number"] += shift


def write(events: list[Event]) -> None:
    """Write ``events`` in one transaction: forward-only, insert-race safe."""
    # Imported here: middleware loads this module before the app registry is ready.
    from jobs.models import Job, JobAttempt

    merged, failures = _merge(events)
    with transaction.atomic():
        lost = _redeliveries(merged)
        _upsert(merged)
        if lost and failures:
            _renumber(failures)
        failures += lost
        for event in merged:
            if event.annotate and event.progress < TERMINAL:
                stats.statements += 1
                Job.objects.filter(message_id=event.message_id, progress__lt=TERMINAL).update(
                    **event.annotate
                )
        if failures:
            stats.statements += 1
            JobAttempt.objects.bulk_create(
                [JobAttempt(**failure) for failure in failures], ignore_conflicts=True
            )
    stats.writes += 1


def _write_safely(events: list[Event]) -> None:
    try:
        write(events)
    except Exception:
        stats.write_failures += 1
        metrics.LEDGER_WRITE_FAILURES.inc()
        logger.exception("Job ledger write failed; %d event(s) not recorded", len(events))


class BatchWriter:
    """A background thread writing buffered events: every ``interval`` seconds, or
    at once when a caller waits for its event to be durable (group commit: the
    events of every waiting worker thread go out in one transaction).
    """

    DURABLE_WAIT = 5.0  # seconds; past it the job goes on and the event stays queued

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.pid = os.getpid()
        self.buffer: deque[tuple[int, Event]] = deque()
        self.condition = threading.Condition()
        self.added = 0  # sequence number of the last event added
        self.written = 0  # ... and of the last event whose write was attempted
        self.urgent = False
        self.thread = threading.Thread(target=self._run, name="job-ledger-writer", daemon=True)
        self.thread.start()

    def add(self, event: Event, *, durable: bool = False) -> None:
        with self.condition:
            self.added += 1
            seq = self.added
            self.buffer.append((seq, event))
            if not durable:
                return
            self.urgent = True
            self.condition.notify_all()
            if not self.condition.wait_for(lambda: self.written >= seq, self.DURABLE_WAIT):
                logger.warning(
                    "Job ledger write slower than %.0f s; not waiting", self.DURABLE_WAIT
                )

    def flush(self, timeout: float = 10.0) -> bool:
        """Write everything added so far; True when it was written in time."""
        with self.condition:
            target = self.added
            self.urgent = True
            self.condition.notify_all()
            return self.condition.wait_for(lambda: self.written >= target, timeout)

    def _take(self) -> tuple[int, list[Event]]:
        with self.condition:
            self.condition.wait_for(lambda: self.urgent, self.interval)
            self.urgent = False
            taken = list(self.buffer)
            self.buffer.clear()
        return (taken[-1][0] if taken else 0), [event for _, event in taken]

    def _run(self) -> None:
        while True:
            last, events = self._take()
            try:
                if events:
                    _write_safely(events)
            finally:
                close_old_connections()
                with self.condition:
                    self.written = max(self.written, last)
                    self.condition.notify_all()


_writer: BatchWriter | None = None
_writer_lock = threading.Lock()


def _batch_writer() -> BatchWriter:
    global _writer
    interval = settings.JOBS_LEDGER_FLUSH_MS / 1000
    # A forked child (gunicorn, dramatiq processes) has no copy of the thread.
    if _writer is None or _writer.pid != os.getpid() or _writer.interval != interval:
        with _writer_lock:
            if _writer is None or _writer.pid != os.getpid() or _writer.interval != interval:
                _writer = BatchWriter(interval)
    return _writer


def record(event: Event, *, durable: bool = False) -> None:
    """Record ``event``: now (flush interval 0) or with the next batch.

    ``durable`` waits until the event's batch is written: a worker records a
    job's end this way before it acks the message, so a worker killed right
    after never leaves a finished job shown as running.
    """
    if not settings.JOBS_LEDGER_ENABLED:
        return
    stats.events += 1
    if settings.JOBS_LEDGER_FLUSH_MS <= 0:
        _write_safely([event])
    else:
        _batch_writer().add(event, durable=durable)


def flush(timeout: float = 10.0) -> bool:
    """Wait until every event recorded in this process is written."""
    if _writer is None or _writer.pid != os.getpid():
        return True
    return _writer.flush(timeout)
