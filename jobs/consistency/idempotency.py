"""Run a side effect once per idempotency key, even under duplicate delivery.

    sent = run_once(f"welcome-email:{user.pk}", message.send)

The key is claimed in the database before the effect (a unique row naming its
holder: the worker process's broker id), the effect runs outside any
transaction, and the claim is marked done after. A failed effect releases its
claim so the retry can run it.

A duplicate that finds a live claim waits for it (polling, up to ``wait``)
instead of failing: a retry burnt on someone else's work would end the job
"failed" after a crash. The claim of a worker that died mid-effect is taken
over as soon as the broker would redeliver that worker's messages (its
heartbeat is older than the broker's timeout; ``jobs.broker.workers``), not
after a fixed lease. A claim made outside a worker process (no heartbeat) falls
back to its lease. The one window left is a crash between the effect and
marking it done: the effect then runs again (at-least-once, never lost).

Marking the claim done keeps trying through a database outage (a restart, a
failover: ``MARK_DONE_PATIENCE``): the effect ran, and a claim left behind
would hold the job's retries back for the whole lease, then run the effect
again. A live holder is waited for only within its claim's lease: past it, the
claim is taken as stuck (the effect ran but marking it done failed for longer,
or a time limit landed between the two, and the process lives on) and the duplicate fails as a
transient error, so it ends "failed" in the admin after its retries.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import NamedTuple

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone
from dramatiq.middleware import CurrentMessage

from jobs.broker import workers
from jobs.errors import Deferred, JobForceCancelled, TransientJobError
from jobs.models import EffectRecord
from jobs.observability.unavailable import is_lock_contention, is_outage

logger = logging.getLogger(__name__)

DEFAULT_LEASE = timedelta(minutes=10)
# Long enough for any email or upload to finish; shorter than a job's time limit.
DEFAULT_WAIT = timedelta(seconds=30)
POLL_SECONDS = 0.2
# How long marking an effect done keeps trying while the database is out of
# reach: a PostgreSQL restart or failover takes seconds.
MARK_DONE_PATIENCE = timedelta(seconds=60)


class EffectInProgress(Deferred, TransientJobError):
    """Another live worker still holds the claim on this key after ``wait``.

    A deferral, not a failure: the job runs again a little later as the same
    attempt, using up none of its retries (a holder that is alive is working;
    one that dies frees the claim for the next try).
    """


class EffectStuck(TransientJobError):
    """A live worker has held the claim on this key past its lease.

    Not a deferral: its holder is no longer working on it (an effect that ran
    but was never marked done, the process still alive), so waiting would loop
    forever, unseen, with the job "delayed". A failure spends the job's retries
    and ends it "failed", where an operator sees the key and the holder and
    decides (delete the claim to run the effect again, or mark it done).
    Bounded by the lease, not by a count of deferrals: the lease already says how
    long a holder may take, and a time reads the same whatever ``wait`` is.
    """


class Held(NamedTuple):
    """A claim some live worker holds."""

    holder: str
    lease_until: datetime


def _holder_dead(holder: str, lease_until: datetime) -> bool:
    if holder:
        return not workers.holder_alive(holder)
    return lease_until < timezone.now()


def _claim(key: str, token: str, lease: timedelta) -> bool | Held:
    """Claim ``key``: True if claimed, False if its effect is done, the claim if a
    live worker holds it."""
    message = CurrentMessage.get_current_message()
    mine = {
        "claim_token": token,
        "lease_until": timezone.now() + lease,
        "holder": workers.identity() or "",
        "job_id": message.message_id if message is not None else "",
    }
    try:
        with transaction.atomic():
            EffectRecord.objects.create(key=key, **mine)
        return True
    except IntegrityError:
        pass
    record = (
        EffectRecord.objects.filter(key=key)
        .values("state", "lease_until", "holder", "claim_token")
        .first()
    )
    if record is None:  # released between our insert and our read: try once more
        return _claim(key, token, lease)
    if record["state"] == EffectRecord.State.DONE:
        return False
    if not _holder_dead(record["holder"], record["lease_until"]):
        return Held(record["holder"], record["lease_until"])
    # Conditional on the old token: of two workers that both saw the holder
    # dead, one takes the claim and the other waits on the new (live) holder.
    taken = EffectRecord.objects.filter(
        key=key, state=EffectRecord.State.RUNNING, claim_token=record["claim_token"]
    ).update(**mine)
    if not taken:  # another duplicate took it first: read the new holder
        return _claim(key, token, lease)
    logger.warning(
        "Took over the claim on %s from %s",
        key,
        f"dead worker {record['holder']}" if record["holder"] else "an expired lease",
    )
    return True


def _still_held(key: str, claim: Held) -> EffectInProgress | EffectStuck:
    if claim.lease_until < timezone.now():
        return EffectStuck(
            f"effect {key!r} is claimed by live worker {claim.holder!r} past its lease"
            f" (since {claim.lease_until:%Y-%m-%d %H:%M:%S} UTC) and never marked done;"
            " delete its EffectRecord to run it again, or mark it done"
        )
    return EffectInProgress(f"effect {key!r} is being run by worker {claim.holder!r}")


@contextmanager
def once_atomic(key: str) -> Iterator[bool]:
    """Exactly once for database effects: the key and the effect commit together.

        with once_atomic(f"invoice:{order_id}") as first:
            if first:
                Invoice.objects.create(...)

    Yields False (and the block should do nothing) when the key was used before.
    A crash before commit rolls back both; a duplicate delivery waits on the
    unique key, then sees it taken.
    """
    with transaction.atomic():
        try:
            with transaction.atomic():
                EffectRecord.objects.create(
                    key=key,
                    state=EffectRecord.State.DONE,
                    claim_token="atomic",
                    lease_until=timezone.now(),
                    done_at=timezone.now(),
                )
        except IntegrityError:
            yield False
            return
        yield True


def run_once(
    key: str,
    effect: Callable[[], object],
    *,
    lease: timedelta = DEFAULT_LEASE,
    wait: timedelta = DEFAULT_WAIT,
) -> bool:
    """Run ``effect`` unless it already ran under ``key``; True if it ran now.

    Waits up to ``wait`` while another live worker holds the key, then raises
    ``EffectInProgress`` (a deferral: the job runs again later, no retry used),
    or ``EffectStuck`` (a transient failure) once the claim is past its lease.
    """
    token = secrets.token_hex(16)
    deadline = time.monotonic() + wait.total_seconds()
    while isinstance(claimed := _claim(key, token, lease), Held):
        if time.monotonic() >= deadline:
            raise _still_held(key, claimed)
        time.sleep(POLL_SECONDS)
    if not claimed:
        logger.info("Effect %s already done; skipped", key)
        return False
    try:
        effect()
    except JobForceCancelled:
        # Stopped from outside at any point of the effect: it may have run, so
        # the claim stays (at-least-once never becomes twice). Once past its
        # lease an operator sees it stuck (EffectStuck) and decides.
        logger.warning("Effect %s stopped by a forced cancel: its claim is kept", key)
        raise
    except BaseException:
        EffectRecord.objects.filter(key=key, claim_token=token).delete()
        raise
    _mark_done(key, token)
    return True


def _mark_done(key: str, token: str) -> None:
    """Mark the claim done, through a database outage or a write lock held by
    another transaction (SQLite's busy timeout ran out) for up to
    ``MARK_DONE_PATIENCE``: the effect ran, and a claim left "running" would
    end the job ``EffectStuck`` after its lease, its effect done."""
    deadline = time.monotonic() + MARK_DONE_PATIENCE.total_seconds()
    pause = POLL_SECONDS
    while True:
        try:
            EffectRecord.objects.filter(key=key, claim_token=token).update(
                state=EffectRecord.State.DONE, done_at=timezone.now()
            )
            return
        except DatabaseError as exc:
            # Inside a caller's transaction the connection cannot be replaced.
            waitable = is_outage(exc) or is_lock_contention(exc)
            if not waitable or connection.in_atomic_block or time.monotonic() > deadline:
                raise
            logger.warning("Effect %s ran; marking it done waits for the database: %s", key, exc)
            if is_outage(exc):
                connection.close()  # the lost connection is unusable; the next query reconnects
            time.sleep(pause)
            pause = min(pause * 2, 5.0)
