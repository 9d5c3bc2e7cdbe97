"""A running job tells how far it has got: ``progress.report(3, 5, "rendering")``.

Shown in the admin (a bar on the list and the job page), in the task status
API (``"progress": {"done": 3, "total": 5, "note": "rendering"}``) and as the
``jobs_progress_ratio`` metric. Checkpoints report it by themselves
(``jobs.consistency.checkpoints.save(step, total=...)``).

Throttled: at most one database write per job every ``JOBS_PROGRESS_INTERVAL_MS``
(a tight loop may call it per item), the latest value kept for the next write
and written when the job ends. A report that reaches a total is written at once.
The fields are the ledger row's own (``progress_done``, ``progress_total``,
``progress_note``), written with an UPDATE of that row, so they survive a retry:
a retry starts from what its checkpoints reported, not from zero.

Best effort: a database that refuses the write loses the report (logged), never
the job. Each report is also a cancellation check point
(``jobs.runtime.cancellation.check``). Outside a worker it does nothing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction
from django.utils import timezone
from dramatiq.common import q_name
from dramatiq.middleware import CurrentMessage

from jobs.conf import jobs_settings
from jobs.runtime import cancellation

logger = logging.getLogger(__name__)
MAX_NOTE = 200
# How long a first report waits for the ledger to write the job's row.
LEDGER_WAIT_S = 2.0
MAX_VALUE = 2**63 - 1


@dataclass
class Progress:
    done: int
    total: int | None
    note: str


@dataclass
class _State:
    message_id: str
    actor: str
    queue: str
    written_at: float = float("-inf")
    pending: Progress | None = None
    row_flushed: bool = False
    reached: bool = False  # a report reaching its total was written


def report(done: int, total: int | None = None, note: str = "") -> None:
    """Record that the running job has done ``done`` of ``total`` (``total`` may be
    unknown) with a short ``note``; raises ``JobCancelled`` if it was cancelled."""
    if isinstance(done, bool) or not isinstance(done, int) or done < 0:
        raise ValueError(f"progress: done must be an int >= 0, not {done!r}")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
        raise ValueError(f"progress: total must be an int >= 0 or None, not {total!r}")
    cancellation.check()
    state = _state()
    if state is None:
        return
    # The columns hold up to 2**63 - 1: a larger count is shown as that.
    done, total = min(done, MAX_VALUE), None if total is None else min(total, MAX_VALUE)
    state.pending = Progress(done, total, str(note)[:MAX_NOTE])
    interval = jobs_settings.JOBS_PROGRESS_INTERVAL_MS / 1000
    # Reaching the total is written at once, once: a loop that goes on
    # reporting past it is throttled like any other.
    reached = total is not None and done >= total and not state.reached
    if reached or time.monotonic() - state.written_at >= interval:
        state.reached = state.reached or reached
        _write(state)


def flush(running: cancellation.Running) -> None:
    """Write the last report of a job that ends, if not written yet."""
    state = running.progress
    if isinstance(state, _State) and state.pending is not None:
        _write(state)


def _state() -> _State | None:
    running = cancellation.registry.current()
    message = CurrentMessage.get_current_message()
    if running is None or message is None or message.message_id != running.message_id:
        return None
    state = getattr(running, "progress", None)
    if not isinstance(state, _State):
        state = _State(message.message_id, message.actor_name, q_name(message.queue_name))
        running.progress = state
    return state


def _write(state: _State) -> None:
    from jobs.ledger import writer as ledger
    from jobs.models import Job
    from jobs.observability import metrics

    pending = state.pending
    assert pending is not None

    def update() -> int:
        with transaction.atomic():  # a savepoint inside the job's own transaction
            return Job.objects.filter(message_id=state.message_id).update(
                progress_done=pending.done,
                progress_total=pending.total,
                progress_note=pending.note or None,
                progress_at=timezone.now(),
            )

    try:
        written = update()
        if not written and not state.row_flushed and not connection.in_atomic_block:
            # The ledger has no row for it yet (its first events wait in a
            # batch or the intake): written now, once per job, then again.
            # Not inside the job's own transaction: on SQLite the writer would
            # wait for it to commit.
            state.row_flushed = True
            ledger.flush(LEDGER_WAIT_S)
            written = update()
    except (DatabaseError, ValueError, OverflowError) as exc:
        # Never the job's failure. This report is dropped; the next one is tried.
        logger.warning("Progress of job %s not recorded: %s", state.message_id, exc)
        state.written_at = time.monotonic()
        state.pending = None
        return
    if not written:
        # Still no row: kept pending, tried again at the next report or the end.
        return
    state.written_at = time.monotonic()
    state.pending = None
    if pending.total:
        metrics.PROGRESS.labels(state.actor, state.queue).set(
            min(pending.done / pending.total, 1.0)
        )
