"""Operator actions on jobs: retry, cancel, delete. Batched, never all in memory."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import dramatiq
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from jobs.broker import queues, redis_broker
from jobs.broker.limits import DELIVERY_OPTIONS
from jobs.consistency import dedup
from jobs.consistency.outbox import message_send_on_commit
from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable
from jobs.ledger import states
from jobs.ledger.redaction import contains_redaction
from jobs.ledger.storable import altered
from jobs.models import Job, OutboxMessage

logger = logging.getLogger(__name__)
BATCH = 500
# Options that belong to one delivery, not to the job: dropped when retrying.
# scheduled_at is when the scheduler sent a periodic tick: periodiq skips a
# message whose scheduled_at is older than JOBS_PERIODIC_SKIP_AFTER_S, and a
# retry is a deliberate new run, however late. The tick stays: the retry does
# the failed run's work (the report of that tick's day).
_DELIVERY_OPTIONS = DELIVERY_OPTIONS | {"retry_of", "scheduled_at"}


@dataclass
class Outcome:
    done: int = 0
    skipped: int = 0
    # retry: jobs retried before (one retry per failed job); cancel: running
    # jobs asked to stop before
    already: int = 0
    # retry: of ``done``, those kept in the outbox (Redis did not take them yet)
    kept: int = 0
    # retry: not tried, Redis not answering (their message there cannot be read)
    unreachable: int = 0
    requested: int = 0  # cancel only: running jobs asked to stop (they end "cancelled")


class _RedisAway(Exception):
    """The dead-letter set could not be read: the message whole is not known."""


def _batches(queryset: QuerySet[Job], *fields: str) -> Iterator[list[dict[str, Any]]]:
    """Rows of ``queryset`` as dicts, ``BATCH`` at a time, walking the primary key."""
    last_id = 0
    base = queryset.order_by("id").values("id", *fields)
    while True:
        rows = list(base.filter(id__gt=last_id)[:BATCH])
        if not rows:
            return
        yield rows
        last_id = rows[-1]["id"]


def _original_message(row: dict[str, Any]) -> dramatiq.Message[Any] | None:
    """The failed message to send again: from the dead-letter set, else from the ledger."""
    message = _dead_letter(row)
    if message is not None:
        return message
    stored = (row["args"], row["kwargs"], row["options"])  # options: a pipeline's next step
    if any(contains_redaction(part) for part in stored):
        return None  # the stored arguments lost a secret; sending them would be wrong
    if any(altered(part) for part in stored):
        return None  # ... or a character or number the database could not store
    return dramatiq.Message(
        queue_name=row["queue_name"],
        actor_name=row["actor_name"],
        args=tuple(row["args"]),
        kwargs=row["kwargs"],
        # The job's own options (a pipeline's next step, a time limit); the
        # delivery ones are dropped with the rest in _retry_message.
        options=dict(row["options"] or {}),
    )


def _dead_letter(row: dict[str, Any]) -> dramatiq.Message[Any] | None:
    """The dead-lettered message, or None once it expired (the ledger's copy of
    the arguments serves then). Raises ``_RedisAway`` when Redis does not
    answer: the ledger keeps only some options (not a pipeline's next step, nor
    callbacks), so a retry built from it while the whole message may still be
    in Redis would quietly lose them."""
    if recently_unreachable():
        raise _RedisAway
    try:
        return queues.dead_letter(row["queue_name"], row["redis_message_id"])
    except UNREACHABLE as exc:
        note_unreachable(exc)
        raise _RedisAway from exc


# An operator's bulk action (jobs.admin.bulk) acts with the rights of the one
# who asked: a retry by anybody else would act in their name. Started again
# from the list instead, by someone allowed to.
NOT_RETRIABLE = frozenset({"bulk_action"})


def retry_jobs(queryset: QuerySet[Job]) -> Outcome:
    """Send failed jobs again as new messages linked to the original.

    A failed job is retried once: the new message's id is claimed on the failed
    row by a conditional update, so a double click or two operators at once
    send one message, whatever the ledger has written yet (its rows arrive in
    batches, JOBS_LEDGER_FLUSH_MS). The message goes through the outbox in the
    claim's transaction: a Redis that is down or hung delays it (the relay
    sends it once Redis answers) but neither loses it nor sends it twice.
    """
    outcome = Outcome()
    broker = redis_broker()
    fields = (
        "message_id",
        "queue_name",
        "actor_name",
        "redis_message_id",
        "args",
        "kwargs",
        "options",
        "retried_as",
    )
    for rows in _batches(queryset.filter(state=states.FAILED), *fields):
        for row in rows:
            if row["retried_as"] is not None:
                outcome.already += 1
                continue
            if row["actor_name"] in NOT_RETRIABLE:
                outcome.skipped += 1
                continue
            try:
                original = _original_message(row) if row["actor_name"] in broker.actors else None
            except _RedisAway:
                outcome.unreachable += 1
                continue
            if original is None:
                outcome.skipped += 1
                continue
            retry = _retry_message(row, original)
            try:
                with transaction.atomic():
                    if not _claim(row["message_id"], retry.message_id):
                        outcome.already += 1
                        continue
                    message_send_on_commit(retry)
            except ValueError as exc:  # too large, or not storable by the outbox
                logger.warning("Could not retry %s: %s", row["message_id"], exc)
                outcome.skipped += 1
                continue
            _drop_dead_letter(row)
            outcome.done += 1
            # Inside a caller's transaction (ATOMIC_REQUESTS) the publish waits
            # for its commit: not known yet, not counted.
            published_now = not transaction.get_connection().in_atomic_block
            pending = OutboxMessage.objects.filter(message_id=retry.message_id, sent_at=None)
            if published_now and pending.exists():
                outcome.kept += 1
    logger.info(
        "Retried %d job(s) (%d kept until Redis answers), %d already retried, "
        "%d could not be retried, %d not tried (Redis not answering)",
        outcome.done,
        outcome.kept,
        outcome.already,
        outcome.skipped,
        outcome.unreachable,
    )
    return outcome


def _drop_dead_letter(row: dict[str, Any]) -> None:
    """Best effort: a dead letter left behind expires with the others, and its
    row's ``retried_as`` keeps it from being retried twice."""
    if recently_unreachable():
        return
    try:
        queues.drop_dead_letter(row["queue_name"], row["redis_message_id"])
    except UNREACHABLE as exc:
        note_unreachable(exc)


def _retry_message(row: dict[str, Any], original: dramatiq.Message[Any]) -> dramatiq.Message[Any]:
    """A new message (new id, fresh attempt count) with the original's arguments
    and actor options; ``retry_of`` lets the admin link the two both ways."""
    options = {k: v for k, v in original.options.items() if k not in _DELIVERY_OPTIONS}
    options["retry_of"] = row["message_id"]
    return dramatiq.Message(
        queue_name=row["queue_name"],
        actor_name=row["actor_name"],
        args=tuple(original.args),
        kwargs=dict(original.kwargs),
        options=options,
    )


def _claim(failed_id: str, retry_id: str) -> bool:
    """True for exactly one caller per failed job, across processes."""
    claimed = Job.objects.filter(
        message_id=failed_id, state=states.FAILED, retried_as__isnull=True
    ).update(retried_as=retry_id)
    return claimed == 1


def cancel_jobs(queryset: QuerySet[Job], *, by: str = "") -> Outcome:
    """Cancel jobs that have not ended: waiting ones at once (workers skip them),
    running ones by asking them to stop (``jobs.runtime.cancellation``).

    ``done`` counts the waiting jobs cancelled, ``requested`` the running ones
    asked to stop: the worker records them "cancelled" when they do. A job that
    ended meanwhile is neither (too late; the caller counts it).
    """
    outcome = Outcome()
    now = timezone.now()
    who = by[:150] or None
    waiting_states = (states.ENQUEUED, states.DELAYED)
    live = queryset.filter(state__in=(*waiting_states, states.RUNNING))
    for rows in _batches(live, "message_id", "options", "state"):
        ids = [row["message_id"] for row in rows]
        running = Job.objects.filter(message_id__in=ids, state=states.RUNNING)
        unasked = running.filter(cancel_requested_at__isnull=True)
        # Running jobs are marked before the cancel reaches Redis: a job that
        # checks often stops within milliseconds of it, and the worker's
        # "cancelled" record would otherwise land first, leaving the cancel
        # counted as neither and its author unrecorded.
        outcome.requested += unasked.update(cancel_requested_at=now, cancelled_by=who)
        queues.cancel(ids)
        outcome.done += Job.objects.filter(message_id__in=ids, state__in=waiting_states).update(
            state=states.CANCELLED,
            skip_reason="cancelled",
            finished_at=now,
            cancel_requested_at=now,
            cancelled_by=who,
        )
        # progress is left as it was: a worker that picked the message up before
        # it saw the cancel (JOBS_CONTROL_REFRESH_MS) records the run over this,
        # and one that skips it records the final "cancelled". A job that started
        # between the read and the cancel is asked now.
        asked = unasked.update(cancel_requested_at=now, cancelled_by=who)
        outcome.requested += asked
        # Asked before (a double click, a second operator): still stopping.
        earlier = running.filter(cancel_requested_at__isnull=False).exclude(cancel_requested_at=now)
        outcome.already += earlier.count()
        _free_dedup_keys(rows)
    return outcome


def _free_dedup_keys(rows: list[dict[str, Any]]) -> None:
    """Free the send_unique() keys of cancelled jobs.

    A cancelled unique job must not block the next one until a worker reaches it
    (it may be delayed for hours) or the key expires. Only jobs the cancel did
    stop (not one a worker started meanwhile), and token-checked: a newer job
    holding the key keeps it.
    """
    keys = {
        row["message_id"]: row["options"][dedup.OPTION]
        for row in rows
        if isinstance(row["options"].get(dedup.OPTION), str)
    }
    if not keys:
        return
    cancelled = Job.objects.filter(
        message_id__in=list(keys), state=states.CANCELLED, skip_reason="cancelled"
    ).values_list("message_id", flat=True)
    for message_id in cancelled:
        dedup.clear(keys[message_id], message_id)


def delete_jobs(queryset: QuerySet[Job]) -> Outcome:
    """Delete jobs (and their attempts) in primary-key batches."""
    outcome = Outcome()
    for rows in _batches(queryset):
        Job.objects.filter(id__in=[row["id"] for row in rows]).delete()
        outcome.done += len(rows)
    return outcome
