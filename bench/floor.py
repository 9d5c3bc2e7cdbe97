"""The least a durable record of every job costs: the bench's "floor" stack.

Raw Dramatiq plus one middleware: each finished job's row (its message id,
actor, queue, state and times) joins a batch that one thread per worker
process inserts, a transaction per batch, into a table with nothing but its
primary key. No arguments, no events before the end, no indexes for an
admin, no held acks, no metrics: what any job record kept in the database
pays at the least, whoever writes it. Its ratio against raw Dramatiq bounds
what a ledger could reach on this machine (``throughput`` and
``throughput-pg``).
"""

from __future__ import annotations

import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

import dramatiq

TABLE = "bench_floor"
CREATE = (
    f"CREATE TABLE {TABLE} (message_id varchar(36) PRIMARY KEY, actor_name varchar(200), "
    "queue_name varchar(200), state varchar(10), enqueued_at double precision, "
    "started_at double precision, finished_at double precision, duration_ms integer)"
)
DONE = f"select count(*) from {TABLE}"
_INSERT = f"INSERT INTO {TABLE} VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"

# The ledger's default flush interval (JOBS_LEDGER_FLUSH_MS): batches as large.
FLUSH_SECONDS = 0.2

Row = tuple[str, str, str, str, float, float, float, int]


def _writer(database_url: str) -> Callable[[list[Row]], None]:
    """Inserts one batch in one transaction, on its own connection."""
    if database_url.startswith("sqlite:///"):
        db = sqlite3.connect(database_url.removeprefix("sqlite:///"), timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        sql = _INSERT.replace("%s", "?")

        def write_sqlite(rows: list[Row]) -> None:
            with db:
                db.executemany(sql, rows)

        return write_sqlite
    import psycopg

    connection = psycopg.connect(database_url)

    def write_postgres(rows: list[Row]) -> None:
        with connection.transaction(), connection.cursor() as cursor:
            cursor.executemany(_INSERT, rows)

    return write_postgres


class FloorLedger(dramatiq.Middleware):
    """Writes each processed job's row from a thread, in batches."""

    def __init__(self, database_url: str) -> None:
        self.rows: queue.SimpleQueue[Row] = queue.SimpleQueue()
        self.started: dict[str, float] = {}
        self.database_url = database_url

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        threading.Thread(target=self._write, daemon=True).start()

    def before_process_message(
        self, broker: dramatiq.Broker, message: dramatiq.MessageProxy
    ) -> None:
        self.started[message.message_id] = time.time()

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: dramatiq.MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        finished = time.time()
        started = self.started.pop(message.message_id, finished)
        state = "failed" if exception is not None else "succeeded"
        self.rows.put(
            (
                message.message_id,
                message.actor_name,
                message.queue_name,
                state,
                message.message_timestamp / 1000,
                started,
                finished,
                int((finished - started) * 1000),
            )
        )

    def _write(self) -> None:
        write = _writer(self.database_url)
        while True:
            batch = [self.rows.get()]
            time.sleep(FLUSH_SECONDS)
            while True:  # everything that came meanwhile: one transaction
                try:
                    batch.append(self.rows.get_nowait())
                except queue.Empty:
                    break
            write(batch)


def middleware() -> FloorLedger:
    return FloorLedger(os.environ["DATABASE_URL"])
