"""Record job events in the database: the write side of the job ledger.

Every Dramatiq hook becomes an ``Event``. ``record()`` writes it at once when
``JOBS_LEDGER_FLUSH_MS`` is 0, otherwise hands it to a per-process background
writer that merges the events of each flush into one transaction. A job's end
(success, failure or skip) is written before the worker acks the message, so a
killed worker never leaves a finished job unrecorded. On the project's broker
the worker thread does not wait for that write: the consumer hands the ack to
the writer (``after_written``), which sends the acks of a whole batch in one
Redis round trip right after committing it (group commit without a blocked
thread). Elsewhere the thread waits (``durable=True``). Writes are ordered by
``progress``:

    progress = position * 10 + phase           phase: delayed 1, enqueued 2, running 3
    position = attempt_index * DEFERRAL_SLOTS + deferrals of that attempt
    progress = TERMINAL for succeeded, failed and skipped

(phase 0 is the watchdog's: an end it guessed for a message Redis no longer
holds, which any later event of the message replaces, along with the guess's
note)

and applied by a conditional upsert (``progress < new``), so events may arrive
late, twice, or from several processes in any order without moving a job
backwards; a deferral (a rate limit) moves the job on to "delayed" without
starting a new attempt. A batch's rows are written in message-id order, so two
writers never take row locks in opposite orders; a batch that still loses a
deadlock (or a lock timeout) is written again. A batch the database refuses for a
reason of its own (unreachable, read-only, a statement timeout, a full disk, a
lock held too long) is kept with its acks and written again later: its jobs are
never acked unrecorded. Only a batch refused for its events' values (integrity
and data errors, SQLSTATE classes 23 and 22) is written job by job, and only
the jobs whose own events are refused are given up: logged and counted, never
raised, since the ledger must not break the job it records.
"""

from __future__ import annotations

import logging
import os
import random
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db import (
    DEFAULT_DB_ALIAS,
    DataError,
    IntegrityError,
    connection,
    connections,
    transaction,
)
from django.db import Error as DjangoDbError

from jobs.conf import jobs_settings
from jobs.ledger.states import RUNNING
from jobs.ledger.storable import storable, storable_columns
from jobs.ledger.upsert import annotate, batch_cursor, insert_references, upsert
from jobs.observability import metrics

logger = logging.getLogger(__name__)

PHASE_GUESSED, PHASE_DELAYED, PHASE_ENQUEUED, PHASE_RUNNING = 0, 1, 2, 3
TERMINAL = 10**12
# Deferrals counted per attempt: 10**6 slots leave room for 10**5 attempts below
# TERMINAL. Past the last slot a deferral no longer moves the job forward (and
# the next start looks like a redelivery).
DEFERRAL_SLOTS = 10**6


def progress_of(attempt_index: int, phase: int, deferrals: int = 0) -> int:
    position = attempt_index * DEFERRAL_SLOTS + min(deferrals, DEFERRAL_SLOTS - 1)
    return position * 10 + phase


def with_phase(progress: int, phase: int) -> int:
    """``progress`` moved to ``phase`` of the same attempt and deferral."""
    return progress - progress % 10 + phase


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
    # A start that resumes an attempt a deferral interrupted: not a new attempt.
    resumes: bool = False
    # Set by the writer: the progress of the latest start merged into this event.
    started_progress: int | None = None
    # The objects the message's arguments name (``jobs.ledger.references``),
    # stored as the job's JobReference rows.
    subjects: tuple[str, ...] = ()


@dataclass
class Stats:
    """Per-process ledger counters (exported as metrics)."""

    events: int = 0
    writes: int = 0
    statements: int = 0
    write_failures: int = 0
    retries: int = 0  # batches written again after a deadlock or lock timeout
    write_seconds: float = 0.0  # spent writing batches (the bench's cost per job)


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
            current = merged[event.message_id] = Event(
                event.message_id,
                event.state,
                event.progress,
                dict(event.create),
                dict(event.update),
                annotate=dict(event.annotate),
                subjects=event.subjects,
            )
        else:
            current.state, current.progress = event.state, event.progress
            current.update.update(event.update)
            current.annotate.update(event.annotate)
            current.subjects = current.subjects or event.subjects
            for key, value in event.create.items():
                current.create.setdefault(key, value)
        if "started_at" in event.update:
            # How the attempt count moves belongs to the start that set it,
            # even when a later event of the batch carries the job further.
            current.started_progress, current.resumes = event.progress, event.resumes
    return list(merged.values()), failures


def _redeliveries(merged: list[Event]) -> list[dict[str, Any]]:
    """Attempts that started again without finishing: one failure row each.

    An event that starts attempt *n* while the ledger shows attempt *n* running
    since another time means the broker delivered the message again: its worker
    died (or the message was sent twice). Only rows in state running are read.
    """
    from jobs.models import Job

    starting = {e.message_id: e for e in merged if e.started_progress is not None}
    if not starting:
        return []
    running = _running(list(starting))
    if not running:
        return []
    stats.statements += 1
    rows = Job.objects.filter(message_id__in=running, state=RUNNING).values(
        "message_id", "progress", "attempts", "started_at", "worker_host", "worker_pid"
    )
    failures = []
    for row in rows:
        event = starting[row["message_id"]]
        same_start = row["progress"] == event.started_progress
        if same_start and row["started_at"] != event.update["started_at"]:
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


def _running(message_ids: list[str]) -> list[str]:
    """Which of ``message_ids`` have a row in state running.

    Almost always none (a start finds its job enqueued or delayed), so this
    plain SELECT of the ids comes first, and the ORM query that reads the rows
    (and converts their times) runs only for a redelivery: building that query
    for a batch's hundred ids cost the writer more than the whole SELECT.

    On PostgreSQL the ids go as one array parameter bound on the server
    (``batch_cursor``), where Django's cursor quoted each id into the query
    text in the writer thread and the server parsed the 60 literals of a
    typical batch: about 8 us of the writer thread per job (issue 17). Never
    prepared: its plan would be the one made while the table was small, a
    scan of the whole table, kept as it grows (measured: twice the server's
    CPU per job).
    """
    from jobs.models import Job

    stats.statements += 1
    conn = connections[DEFAULT_DB_ALIAS]
    quote = conn.ops.quote_name
    select = (
        f"SELECT {quote('message_id')} FROM {quote(Job._meta.db_table)} "
        f"WHERE {quote('state')} = %s AND {quote('message_id')} "
    )
    params: list[Any]
    if conn.vendor == "postgresql":
        sql, params = f"{select}= ANY(%s)", [RUNNING, message_ids]
    else:  # (SQLite has no arrays)
        sql, params = (
            f"{select}IN ({', '.join(['%s'] * len(message_ids))})",
            [RUNNING, *message_ids],
        )
    with batch_cursor(conn, prepared=False) as cursor:
        cursor.execute(sql, params)
        return [message_id for (message_id,) in cursor.fetchall()]


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


def _make_storable(merged: list[Event], failures: list[dict[str, Any]]) -> None:
    """Strip what the database would refuse (NUL, lone surrogates, overlong text)."""
    from jobs.models import Job, JobAttempt

    for event in merged:
        event.create = storable_columns(Job, event.create)
        event.update = storable_columns(Job, event.update)
        event.annotate = storable_columns(Job, event.annotate)
        event.subjects = tuple(storable(subject) for subject in event.subjects)
    failures[:] = [storable_columns(JobAttempt, failure) for failure in failures]


def write(events: list[Event]) -> None:
    """Write ``events`` in one transaction: forward-only, insert-race safe."""
    # Imported here: middleware loads this module before the app registry is ready.
    from jobs.models import JobAttempt

    merged, failures = _merge(events)
    _make_storable(merged, failures)
    merged.sort(key=lambda e: e.message_id)  # one lock order for every statement below
    with transaction.atomic():
        lost = _redeliveries(merged)
        upsert(merged)
        stats.statements += 1
        if insert_references(merged):
            stats.statements += 1
        if lost and failures:
            _renumber(failures)
        failures += lost
        stats.statements += annotate(merged, TERMINAL)
        if failures:
            failures.sort(key=lambda f: (f["job_id"], f["number"]))
            stats.statements += 1
            JobAttempt.objects.bulk_create(
                [JobAttempt(**failure) for failure in failures], ignore_conflicts=True
            )
    stats.writes += 1


# PostgreSQL's SQLSTATEs for a transaction that lost to another one and may
# simply run again: deadlock_detected, serialization_failure, lock_not_available
# (lock_timeout).
_TRANSIENT_SQLSTATES = frozenset({"40P01", "40001", "55P03"})
# Seconds between tries while the database is unreachable (doubling up to the max).
OUTAGE_WAITS = (0.5, 5.0)


class DatabaseUnreachable(Exception):
    """The database could not take the write now (unreachable, or refusing
    writes for a reason that is not in the events): kept for later, not given up."""


def caused_by_events(exc: BaseException) -> bool:
    """Whether the write failed because of the events' own values.

    Integrity and data errors (a CHECK or NOT NULL broken, a value out of
    range, a NUL in text on PostgreSQL: SQLSTATE classes 23 and 22), or an error
    raised before the database saw the values (an int too large for SQLite).
    Anything else the database says (read-only 25006, statement timeout 57014,
    disk full, a lock held past the busy timeout, a missing table) is about the
    database, and writing the same events later will work.
    """
    if isinstance(exc, IntegrityError | DataError):
        return True
    # django.db.Error, not DatabaseError: InterfaceError (psycopg's "the
    # connection is closed") is a sibling of DatabaseError, and about the database.
    return not isinstance(exc, DjangoDbError)


# The writer thread reconnects this often, so a database moved behind a proxy or
# DNS name is followed (errors reconnect at once).
CONNECTION_MAX_AGE = 60.0
RETRY_DELAYS = (0.05, 0.1, 0.2, 0.4)  # seconds before each new try, before jitter


def _is_transient(exc: BaseException) -> bool:
    cause: BaseException | None = exc
    while cause is not None:
        code = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)  # psycopg 3, 2
        if code in _TRANSIENT_SQLSTATES:
            return True
        # SQLite's busy timeout ran out while another connection held the lock.
        if isinstance(cause, sqlite3.OperationalError) and "locked" in str(cause):
            return True
        cause = cause.__cause__
    return False


def _write_retrying(events: list[Event]) -> None:
    """``write``, again after a short, jittered wait while it loses to other writers."""
    for delay in (*RETRY_DELAYS, None):
        try:
            write(events)
            return
        except Exception as exc:
            # Inside a caller's transaction the rollback undid the caller's work
            # too (and its locks may be what we wait for): not ours to redo.
            if delay is None or connection.in_atomic_block or not _is_transient(exc):
                raise
            stats.retries += 1
            logger.warning("Job ledger write will be tried again: %s", str(exc).splitlines()[0])
            time.sleep(delay * random.uniform(1, 2))


def _lost(jobs: int, message: str, *args: object, exc_info: bool = True) -> None:
    stats.write_failures += jobs
    metrics.LEDGER_WRITE_FAILURES.inc(jobs)
    logger.error(message, *args, exc_info=exc_info)


def _write_safely(events: list[Event], *, outage_raises: bool = False) -> None:
    """Write ``events``; if the batch is refused for its values, each job's on its own.

    One job's bad event (a value the database refuses) must not lose the other
    jobs' events of its batch, so such a batch is split by job, every job
    tried. With ``outage_raises``, a refusal that is not about the values
    (``caused_by_events``) raises ``DatabaseUnreachable`` at any point, the
    batch or one job: the caller keeps the whole batch and its acks, and writes
    it again later (the jobs written meanwhile are written again: an event
    applies once, whatever the repeats).
    """
    try:
        _write_retrying(events)
        return
    except Exception as exc:
        if outage_raises and not caused_by_events(exc):
            raise DatabaseUnreachable(_first_line(exc)) from exc
        by_job: dict[str, list[Event]] = {}
        for event in events:
            by_job.setdefault(event.message_id, []).append(event)
        if len(by_job) == 1 and not connection.in_atomic_block and caused_by_events(exc):
            connection.close_if_unusable_or_obsolete()
            [(message_id, own)] = by_job.items()
            _salvage(message_id, own, exc)
            return
        if len(by_job) == 1 or connection.in_atomic_block:
            jobs = ", ".join(by_job)
            _lost(
                len(by_job),
                "Job ledger write failed for %s; %d event(s) not recorded",
                jobs,
                len(events),
            )
            return
        logger.warning(
            "Job ledger write of a batch failed; writing its %d job(s) one by one",
            len(by_job),
            exc_info=True,
        )
    for message_id, own in by_job.items():
        try:
            _write_retrying(own)
        except Exception as exc:
            # A broken connection is reopened for the next try, not reused.
            connection.close_if_unusable_or_obsolete()
            if outage_raises and not caused_by_events(exc):
                raise DatabaseUnreachable(_first_line(exc)) from exc
            _salvage(message_id, own, exc)


# Set on the row of a job whose own values the database refused (_salvage).
VALUES_REFUSED = "LedgerValuesRefused"


def _salvage(message_id: str, own: list[Event], exc: BaseException) -> None:
    """Record a job whose own values the database refused (a message sent with
    ``max_retries=-2``, a name too long) with what always fits: its identity and
    its latest state, and a note of what was refused, so that no job that ran is
    missing from the ledger. Counted as a write failure either way."""
    latest = max(own, key=lambda event: event.progress)
    created = next((event.create for event in own if event.create), {})
    # The first line only: PostgreSQL's DETAIL ("Failing row contains (...)")
    # would copy the job's arguments into the note.
    note = (
        f"The ledger refused this job's own values ({type(exc).__name__}: "
        f"{_first_line(exc)[:300]}); only its state is recorded."
    )
    salvaged = Event(
        message_id,
        latest.state,
        latest.progress,
        {
            "actor_name": str(created.get("actor_name") or "")[:200],
            "queue_name": str(created.get("queue_name") or "")[:200],
            "enqueued_at": created.get("enqueued_at") or datetime.now(UTC),
        },
        {"error_type": VALUES_REFUSED, "error_message": note},
    )
    try:
        _write_retrying([salvaged])
    except Exception:
        connection.close_if_unusable_or_obsolete()
        _lost(
            1,
            "Job ledger write failed for job %s; %d event(s) not recorded",
            message_id,
            len(own),
        )
        return
    _lost(
        1,
        "Job ledger refused the values of job %s; recorded its state (%s) only",
        message_id,
        latest.state,
        exc_info=False,
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


# Runs the acks (or any step) held until their events were written: called once
# per batch with every item that became ready, it returns the items to try again.
AfterWritten = Callable[[list[Any]], list[Any]]


class BatchWriter:
    """A background thread writing buffered events: every ``interval`` seconds, or
    at once when a caller waits for its event to be durable (group commit: the
    events of every waiting worker thread go out in one transaction), or when an
    ack waits for it.
    """

    DURABLE_WAIT = 5.0  # seconds; past it the job goes on and the event stays queued
    # This thread's database connection, and when it was first seen (monotonic)
    known_connection: object = None
    connected_at = 0.0

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.pid = os.getpid()
        self.buffer: deque[tuple[int, Event]] = deque()
        # Events nothing waits for (a job's start, an enqueue), appended without
        # the lock; numbered into the buffer by whoever needs them counted (the
        # writer taking a batch, hold_ack, flush).
        self.loose: deque[Event] = deque()
        # The hot paths (add, after_written) take the plain lock itself: its
        # enter and exit are C, where Condition's are Python methods, and a
        # thread can lose the GIL in Condition.__exit__ before it releases the
        # lock (see add). Waits and notifications go through the condition.
        self.mutex = threading.Lock()
        self.condition = threading.Condition(self.mutex)
        self.added = 0  # sequence number of the last event added
        self.written = 0  # ... and of the last event whose write was attempted
        self.settled = 0  # ... and whose held acks were sent too
        self.urgent = False
        # (sequence number, runner, item) of acks handed over by consumers. The
        # number an ack waits for travels with its delivery (``hold``), not in
        # a table by message id: two deliveries of one message in one process
        # (a redelivery while the first runs, a delay-queue copy acked beside
        # the job that sent it) could take each other's.
        self.held: list[tuple[int, AfterWritten, Any]] = []
        self.thread = threading.Thread(target=self._run, name="job-ledger-writer", daemon=True)
        self.thread.start()

    def add(self, event: Event, *, durable: bool = False, before_ack: bool = False) -> int | None:
        """Buffer ``event``; with ``before_ack``, the number its ack must wait for."""
        # Every worker thread comes through here twice per job. A thread can lose
        # the GIL while it holds the lock, and the others then queue on the lock
        # (a convoy that cost more CPU than the work: 8 threads adding two
        # events a loop spent 52-57 us per loop against 17-22 for one thread).
        # So an event nothing waits for takes no lock at all, and the lock is
        # held for a few C-level steps; the writer is woken once per batch (once
        # ``urgent`` is set, it takes the batch whether notified again or not).
        if not (durable or before_ack):
            self.loose.append(event)
            return None
        with self.mutex:
            self.added += 1
            seq = self.added
            self.buffer.append((seq, event))
            if before_ack:
                self._hurry()
                return seq
            # durable (the batch that takes it numbers the loose events before it too)
            self.urgent = True
            self.condition.notify_all()
            if not self.condition.wait_for(lambda: self.written >= seq, self.DURABLE_WAIT):
                logger.warning(
                    "Job ledger write slower than %.0f s; not waiting", self.DURABLE_WAIT
                )
        return None

    def hold_ack(self) -> int:
        """The number an ack waits for to follow every event added so far."""
        with self.condition:
            self._number_loose()
            self._hurry()
            return self.added

    def _number_loose(self) -> None:
        """Move the loose events into the buffer, numbered (the lock held)."""
        while self.loose:
            self.added += 1
            self.buffer.append((self.added, self.loose.popleft()))

    def _hurry(self) -> None:
        """An ack will wait: the writer takes the batch now (the lock held)."""
        if not self.urgent:  # (see add)
            self.urgent = True
            self.condition.notify_all()

    def after_written(self, seq: int | None, runner: AfterWritten, item: Any) -> bool:
        """Have ``runner([item, ...])`` called once the events up to ``seq`` are
        written; False (run it yourself, now) when they are, or nothing waits."""
        if seq is None:
            return False
        with self.mutex:  # (see add)
            if seq <= self.written:
                return False
            self.held.append((seq, runner, item))
            return True

    def flush(self, timeout: float = 10.0) -> bool:
        """Write everything added so far (and send the acks it held); True when
        it was done in time."""
        with self.condition:
            self._number_loose()
            target = self.added
            self.urgent = True
            self.condition.notify_all()
            return self.condition.wait_for(lambda: self.settled >= target, timeout)

    def _tidy_connection(self, *, idle: bool) -> None:
        """Keep this thread's connection from one batch to the next while events
        keep coming; drop it when a pass finds nothing to write, after an error,
        or once it is ``CONNECTION_MAX_AGE`` old.

        Not ``close_old_connections()``: SQLite's CONN_MAX_AGE is 0 (made for
        request threads), and reopening a connection per batch (with its WAL
        pragmas) cost more than the batch's own statements. Closing when idle
        leaves no connection open on a quiet worker (nor on a test database
        about to be dropped).
        """
        now = time.monotonic()
        if connection.connection is None:
            return
        if connection.connection is not self.known_connection:  # opened by this batch
            self.known_connection, self.connected_at = connection.connection, now
        stale = now - self.connected_at > CONNECTION_MAX_AGE
        if idle or stale or connection.errors_occurred:
            connection.close()
        else:
            # The next batch checks the kept connection first (CONN_HEALTH_CHECKS),
            # as Django does for a connection kept between requests: a server
            # that closed it meanwhile (restart, idle timeout) costs a reconnect,
            # not a failed batch.
            connection.health_check_done = False  # type: ignore[attr-defined]

    def _take(self) -> list[tuple[int, Event]]:
        with self.condition:
            self.condition.wait_for(lambda: self.urgent, self.interval)
            self.urgent = False
            self._number_loose()
            taken = list(self.buffer)
            self.buffer.clear()
        return taken

    def _put_back(self, taken: list[tuple[int, Event]]) -> None:
        """Return a batch the database could not take to the front of the buffer."""
        with self.condition:
            self.buffer.extendleft(reversed(taken))

    def _release(self) -> None:
        """Run the held steps whose events are written; keep those that failed."""
        # Sorted out of the lock, which worker threads take for every job (see add).
        with self.condition:
            written = self.written
            held, self.held = self.held, []
        ready: list[tuple[int, AfterWritten, Any]] = []
        later: list[tuple[int, AfterWritten, Any]] = []
        for entry in held:
            (ready if entry[0] <= written else later).append(entry)
        if later:
            with self.condition:
                self.held += later
        by_runner: dict[AfterWritten, list[Any]] = {}
        for _, runner, item in ready:
            by_runner.setdefault(runner, []).append(item)
        retry: list[tuple[int, AfterWritten, Any]] = []
        for runner, items in by_runner.items():
            try:
                failed = runner(items)
            except Exception:
                logger.exception("Job acks after a ledger write failed; trying again")
                failed = items
            retry += [(0, runner, item) for item in failed]
        with self.condition:
            self.held += retry
            if not retry:
                # Settled once its acks are sent: a worker stopping meanwhile
                # (flush) keeps waiting for Redis rather than exit with them.
                self.settled = max(self.settled, written)
            self.condition.notify_all()

    def _run(self) -> None:
        outage_wait = OUTAGE_WAITS[0]
        while True:
            taken = self._take()
            started = time.perf_counter()
            try:
                if taken:
                    _write_safely([event for _, event in taken], outage_raises=True)
            except DatabaseUnreachable as exc:
                # Nothing of the batch is written, so nothing of it is acked: the
                # batch goes back to be written first once the database answers,
                # and its acks wait (past HELD_ACKS_MAX the worker takes no more
                # work). A worker killed meanwhile has its messages redelivered.
                self._put_back(taken)
                connection.close()
                logger.warning(
                    "Job ledger: database unreachable or refusing writes, %d event(s) kept; "
                    "next try in %.1f s: %s",
                    len(taken),
                    outage_wait,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                )
                time.sleep(outage_wait)
                outage_wait = min(outage_wait * 2, OUTAGE_WAITS[1])
                continue
            finally:
                stats.write_seconds += time.perf_counter() - started
            outage_wait = OUTAGE_WAITS[0]
            self._tidy_connection(idle=not taken)
            with self.condition:
                self.written = max(self.written, taken[-1][0] if taken else 0)
                self.condition.notify_all()
            self._release()


_writer: BatchWriter | None = None
_writer_lock = threading.Lock()


def _usable(writer: BatchWriter | None, interval: float) -> bool:
    # A forked child (gunicorn, dramatiq processes) has no copy of the thread;
    # a thread that died must not take every later event of the process with it.
    return (
        writer is not None
        and writer.pid == os.getpid()
        and writer.interval == interval
        and writer.thread.is_alive()
    )


def _batch_writer() -> BatchWriter:
    global _writer
    interval = jobs_settings.JOBS_LEDGER_FLUSH_MS / 1000
    if not _usable(_writer, interval):
        with _writer_lock:
            if not _usable(_writer, interval):
                _writer = BatchWriter(interval)
    assert _writer is not None
    return _writer


def record(event: Event, *, durable: bool = False, before_ack: bool = False) -> int | None:
    """Record ``event``: now (flush interval 0) or with the next batch.

    ``durable`` waits until the event's batch is written: a worker records a
    job's end this way before it acks the message, so a worker killed right
    after never leaves a finished job shown as running. ``before_ack`` gets the
    same order without the wait, for a consumer that asks ``after_written``
    before it acks: it returns the number to ask with (``hold``).
    """
    if not jobs_settings.JOBS_LEDGER_ENABLED:
        return None
    stats.events += 1
    if jobs_settings.JOBS_LEDGER_FLUSH_MS <= 0:
        _write_safely([event])
        return None
    return _batch_writer().add(event, durable=durable, before_ack=before_ack)


def write_now(events: list[Event]) -> None:
    """Write ``events`` in the calling thread (``jobs.ledger.intake``'s drain).

    Raises ``DatabaseUnreachable`` when the database is away, so the caller
    keeps them; any other failure is logged per job, as for a batch.
    """
    stats.events += len(events)
    _write_safely(events, outage_raises=True)


def hold_ack() -> int | None:
    """The number an ack waits for (via ``after_written``) to follow every event
    recorded so far; None when nothing is batched."""
    if jobs_settings.JOBS_LEDGER_ENABLED and jobs_settings.JOBS_LEDGER_FLUSH_MS > 0:
        return _batch_writer().hold_ack()
    return None


ACK_AFTER = "_jobs_ack_after"


def hold(delivery: Any, seq: int | None) -> None:
    """Make ``delivery`` (a worker's MessageProxy) wait for event ``seq`` before
    its ack; the highest number it was given counts."""
    if seq is not None and seq > vars(delivery).get(ACK_AFTER, 0):
        setattr(delivery, ACK_AFTER, seq)


def after_written(delivery: Any, runner: AfterWritten, item: Any) -> bool:
    """Hand ``item`` to ``runner`` once the events ``delivery`` waits for are
    written (see ``BatchWriter.after_written``); False when nothing holds it."""
    writer = _writer
    if writer is None or writer.pid != os.getpid():
        return False
    # Read from the proxy's own attributes: a MessageProxy forwards a missing
    # attribute to its Message, which a copy (a retry) shares fields with.
    return writer.after_written(vars(delivery).get(ACK_AFTER), runner, item)


def flush(timeout: float = 10.0, *, intake: bool = True) -> bool:
    """Wait until every event recorded in this process is written and, with
    ``intake``, every job sent so far by any process (``jobs.ledger.intake``)."""
    done = True
    if _writer is not None and _writer.pid == os.getpid():
        done = _writer.flush(timeout)
    if intake:
        from jobs.ledger.intake import catch_up  # it builds on this module

        done = catch_up(timeout=timeout) and done
    return done
