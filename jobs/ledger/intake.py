"""First sends reach the ledger through Redis, in the same command as the message.

Building a job's "enqueued" event and writing it from the sending process was
three quarters of what the full stack added to ``actor.send()`` (issue 17's
profile: ~75 of ~100 us), paid by every web request that sends a job. So the
broker's enqueue script also pushes ``<queue>\\n<redis message id>`` onto
``<ns>:ledger.intake``: one more list push inside the same atomic command, so
the entry exists exactly when the message does, whoever sent it and however
the sender dies afterwards. The rows are written from there by whoever needs
them first:

- every worker process, each ``JOBS_LEDGER_FLUSH_MS`` (``Drainer``; one process
  at a time holds the drain lock);
- a reader that must see every job now: the admin's job pages, a task's
  ``get_result()``, ``jobs.ledger.writer.flush()`` (``catch_up``).

An entry leaves the list only once its rows are committed, by a trim that
checks the drainer still holds the lock; a drainer killed mid-batch leaves its
entries to the next one (the writes are idempotent upserts). An entry whose
message Redis no longer holds is dropped: the job already ran (or was
cancelled), and the worker's own events carried its row.

Only first sends take this way (``is_first_send``): a retry, a deferral and a
paused queue's put-back are recorded by the worker that enqueues them, before
its ack, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any
from uuid import uuid4

import dramatiq
from django.conf import settings
from django.db import connection
from dramatiq.common import q_name

from jobs.ledger import writer
from jobs.ledger.writer import DatabaseUnreachable, Event
from jobs.middleware.control import PAUSE_REQUEUES

logger = logging.getLogger(__name__)

# Entries per batch: one LRANGE, one HMGET per queue, one transaction.
BATCH = 500
# A drainer that dies holding the lock holds up the intake this long.
LOCK_MS = 10_000

# KEYS: intake, lock; ARGV: token, entries taken. Trims only for the lock's
# holder (one whose lock expired mid-batch leaves the trim to its successor,
# which read the same entries) and renews the lock for the next batch.
_TRIM = f"""
if redis.call("get", KEYS[2]) ~= ARGV[1] then return 0 end
redis.call("ltrim", KEYS[1], ARGV[2], -1)
redis.call("pexpire", KEYS[2], {LOCK_MS})
return 1
"""
_RELEASE = """
if redis.call("get", KEYS[1]) == ARGV[1] then return redis.call("del", KEYS[1]) end
return 0
"""


def intake_key(namespace: str) -> str:
    return f"{namespace}:ledger.intake"


def is_first_send(message: dramatiq.Message[Any]) -> bool:
    """Whether ``message`` is being sent for the first time (not a retry, a
    deferral or a paused queue's put-back, which all set ``retries``)."""
    options = message.options
    return options.get("retries") is None and PAUSE_REQUEUES not in options


def _events(broker: Any, entries: list[bytes]) -> list[Event]:
    from jobs.middleware.ledger import enqueue_event  # the middleware builds the event

    by_queue: dict[str, list[str]] = {}
    for entry in entries:
        queue_name, _, redis_id = entry.decode().partition("\n")
        by_queue.setdefault(queue_name, []).append(redis_id)
    pipe = broker.client.pipeline(transaction=False)
    for queue_name, ids in by_queue.items():
        pipe.hmget(f"{broker.namespace}:{queue_name}.msgs", ids)
    events = []
    for (queue_name, _), found in zip(by_queue.items(), pipe.execute(), strict=True):
        delayed = queue_name != q_name(queue_name)
        for data in found:
            if data is None:  # ran (or cancelled) already: its row came with it
                continue
            try:
                message = dramatiq.Message.decode(data)
                events.append(enqueue_event(broker, message, delayed=delayed))
            except Exception:
                # Never the whole batch for one message: its row comes when it runs.
                logger.exception("Job ledger intake: could not record a queued message")
    return events


def drain(broker: Any, *, deadline: float | None = None) -> bool:
    """Write the intake's entries to the database; False when another process
    is draining it now (or the database is unreachable), so some may be left.

    Runs until the intake is empty or, past ``deadline`` (monotonic), after the
    batch in hand.
    """
    client = broker.client
    key, lock = intake_key(broker.namespace), intake_key(broker.namespace) + ".lock"
    if not client.llen(key):  # the usual case, and no write to Redis for it
        return True
    token = uuid4().hex
    if not client.set(lock, token, nx=True, px=LOCK_MS):
        return False
    try:
        while True:
            entries = client.lrange(key, 0, BATCH - 1)
            if not entries:
                return True
            events = _events(broker, entries)
            if events:
                writer.write_now(events)
            if not client.eval(_TRIM, 2, key, lock, token, len(entries)):
                return False
            if deadline is not None and time.monotonic() > deadline:
                return not client.llen(key)
    except DatabaseUnreachable as exc:
        logger.warning("Job ledger intake: database unreachable, entries kept: %s", exc)
        return False
    finally:
        client.eval(_RELEASE, 1, lock, token)


def catch_up(broker: Any | None = None, timeout: float = 2.0) -> bool:
    """Have every job sent so far in the database (for a reader that must see
    them now): drain, or wait for the process draining. False when the intake
    was not empty within ``timeout`` seconds (a constant stream of sends, an
    unreachable database or Redis); never raises."""
    if not settings.JOBS_LEDGER_ENABLED:
        return True
    broker = broker or dramatiq.get_broker()
    if not getattr(broker, "ledger_intake", False):
        return True
    deadline = time.monotonic() + timeout
    try:
        while True:
            if drain(broker, deadline=deadline):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
    except Exception:
        logger.warning("Job ledger intake not read (Redis unreachable?)", exc_info=True)
        return False


class Drainer:
    """A worker process's thread that moves the intake into the database."""

    # Between drains when JOBS_LEDGER_FLUSH_MS is 0 (nothing is sent this way then)
    IDLE_INTERVAL = 0.2

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="job-ledger-intake", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping.set()
        self.thread.join(timeout)

    def _run(self) -> None:
        failures = 0
        while True:
            # As often as the process's own batches (read each time: tests change it).
            interval = settings.JOBS_LEDGER_FLUSH_MS / 1000 or self.IDLE_INTERVAL
            if self.stopping.wait(interval * (1 + min(failures, 20))):
                return
            try:
                drain(self.broker)
                failures = 0
            except Exception:
                failures += 1
                logger.warning("Job ledger intake not drained; trying again", exc_info=True)
            finally:
                # A pass that wrote opened a connection; none is kept between
                # passes (no idle backend per quiet worker, none left open into
                # a test database's teardown).
                connection.close()
