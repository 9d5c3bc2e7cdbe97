"""Which listed jobs wait for a concurrency slot, and for which key.

A parked job's ledger row stays *enqueued* (it has not started); the list and
the job's page add "waiting for order:42" from Redis, one HMGET per page. With
Redis away the note is left out, after one short wait at most.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.db import connection

from jobs.broker import redis_broker
from jobs.concurrency import slots
from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable
from jobs.ledger import states
from jobs.models import Job


def note_waiting(jobs: Iterable[Job]) -> None:
    """Set ``waiting_for`` (a key, or "") on each of ``jobs``."""
    enqueued = [job for job in jobs if job.state == states.ENQUEUED]
    for job in enqueued:
        job.waiting_for = ""  # type: ignore[attr-defined]
    # Not inside a transaction (the admin's delete and change POSTs): on SQLite
    # it holds the only write lock, which a slow Redis would hold with it.
    if not enqueued or recently_unreachable() or connection.in_atomic_block:
        return
    broker = redis_broker()
    try:
        found = slots.waiting_for(
            broker.client, broker.namespace, [job.message_id for job in enqueued]
        )
    except UNREACHABLE as exc:
        note_unreachable(exc)
        return
    for job in enqueued:
        job.waiting_for = found.get(job.message_id, "")  # type: ignore[attr-defined]
