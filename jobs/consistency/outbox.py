"""The transactional outbox: a job asked for in a transaction is never lost.

    with transaction.atomic():
        user = User.objects.create_user(...)
        send_on_commit(send_welcome_email, user.pk)

The message is written to ``OutboxMessage`` inside the caller's transaction, so
a rollback leaves nothing to send, and a commit leaves a row that must be sent.
Right after commit it is published; if the broker is unreachable then, the
request still succeeds, and the relay thread in every worker process publishes
pending rows with backoff until the broker is back.

Delivery is at-least-once: a relay that dies between publishing and marking the
row sent publishes it again after the claim expires. Both copies carry the same
message id; the ledger records one job and the actors' idempotency keys
(``run_once`` / ``once_atomic``) keep the effect single.

Redis replicates asynchronously: a primary that dies right after taking a
message may not have passed it to its replica, and Sentinel then promotes a
replica without it. With ``JOBS_OUTBOX_WAIT_REPLICAS`` (1 by default under
Sentinel) a row is marked sent only once that many replicas confirmed the
message (``WAIT``, in the enqueue's own round trip); otherwise it stays
pending for the relay, which first asks the ledger whether the job already
started (then it was not lost, and is not sent again).
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

import dramatiq
from django.conf import settings
from django.db import close_old_connections, transaction
from django.db.models import F, Q
from django.utils import timezone

from jobs.broker import redis_broker
from jobs.broker.limits import check_size
from jobs.broker.wakeup import confirmed_by_replicas
from jobs.ledger.storable import unstorable
from jobs.models import Job, OutboxMessage
from jobs.observability import logcontext

logger = logging.getLogger(__name__)
CLAIM = timedelta(seconds=30)
BATCH = 200
_ETA = "outbox_eta"


class PayloadNotStorable(ValueError):
    """Refused at send time: the database cannot store the message's arguments."""


def send_on_commit(actor: dramatiq.Actor[Any, Any], *args: Any, **kwargs: Any) -> OutboxMessage:
    """Write the message in the current transaction; publish it once committed."""
    request_id = logcontext.current().get("request_id")
    options = {"request_id": request_id} if request_id else {}
    message = actor.message_with_options(args=args, kwargs=kwargs, **options)
    return message_send_on_commit(message)


def message_send_on_commit(
    message: dramatiq.Message[Any], *, delay_ms: int | None = None
) -> OutboxMessage:
    """``send_on_commit`` for a message built already; ``delay_ms`` counts from now."""
    check_size(message)  # refuse now, in the request, not later in the relay
    if unstorable(message.asdict()):
        # The row holds the message exactly as it will be sent; PostgreSQL's jsonb
        # refuses NUL (SQLite and PostgreSQL both refuse lone surrogates, NaN):
        # a clear error here, not a DataError deep in the caller's transaction.
        raise PayloadNotStorable(
            f"{message.actor_name} arguments hold NUL, a lone surrogate or a non-finite "
            "number, which the outbox cannot store: send ids or clean text"
        )
    if delay_ms is not None:
        # The due time, not the delay: a row published late by the relay must
        # not wait its whole delay again.
        eta = int(time.time() * 1000) + delay_ms
        message = message.copy(options={_ETA: eta})
    row = OutboxMessage.objects.create(
        message_id=message.message_id,
        actor_name=message.actor_name,
        queue_name=message.queue_name,
        payload=message.asdict(),
    )
    row_id = row.pk
    transaction.on_commit(lambda: publish([row_id]), robust=True)
    return row


def _claim(row_id: int) -> OutboxMessage | None:
    now = timezone.now()
    claimable = Q(claimed_until__isnull=True) | Q(claimed_until__lt=now)
    taken = OutboxMessage.objects.filter(claimable, pk=row_id, sent_at__isnull=True).update(
        claimed_until=now + CLAIM, attempts=F("attempts") + 1
    )
    return OutboxMessage.objects.filter(pk=row_id).first() if taken else None


def _backoff(attempts: int) -> timedelta:
    return timedelta(seconds=min(60.0, 0.5 * 2 ** max(attempts - 1, 0)))


def publish(row_ids: list[int]) -> int:
    """Publish the given rows (those still pending and unclaimed); return how many."""
    sent = 0
    broker = redis_broker()
    for row_id in row_ids:
        row = _claim(row_id)
        if row is None:
            continue
        if row.attempts > 1 and _ledger_saw_it_start(row.message_id):
            # An earlier publish reached a worker but was not confirmed by a
            # replica in time: it survived, sending it again would only duplicate it.
            OutboxMessage.objects.filter(pk=row.pk).update(
                sent_at=timezone.now(), claimed_until=None
            )
            continue
        try:
            options = dict(row.payload.get("options", {}))
            eta, now = options.pop(_ETA, None), time.time() * 1000
            delay = None if eta is None or eta <= now else int(eta - now)
            with confirmed_by_replicas(
                settings.JOBS_OUTBOX_WAIT_REPLICAS, settings.JOBS_OUTBOX_WAIT_TIMEOUT_MS
            ):
                broker.enqueue(dramatiq.Message(**{**row.payload, "options": options}), delay=delay)
        except Exception as exc:
            retry_at = timezone.now() + _backoff(row.attempts)
            OutboxMessage.objects.filter(pk=row.pk).update(
                claimed_until=retry_at, last_error=f"{type(exc).__name__}: {exc}"[:2000]
            )
            logger.warning(
                "Outbox: could not publish %s %s (attempt %d), retrying at %s: %s",
                row.actor_name,
                row.message_id,
                row.attempts,
                retry_at.isoformat(),
                exc,
            )
            continue
        OutboxMessage.objects.filter(pk=row.pk).update(sent_at=timezone.now(), claimed_until=None)
        sent += 1
    return sent


def _ledger_saw_it_start(message_id: str) -> bool:
    return Job.objects.filter(message_id=message_id, started_at__isnull=False).exists()


def pending_ids(limit: int = BATCH) -> list[int]:
    """Rows due for the relay: unsent, unclaimed, and past the committer's own try."""
    now = timezone.now()
    grace = timedelta(milliseconds=settings.JOBS_OUTBOX_GRACE_MS)
    return list(
        OutboxMessage.objects.filter(sent_at__isnull=True, created_at__lt=now - grace)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .order_by("id")
        .values_list("id", flat=True)[:limit]
    )


def relay_once() -> int:
    return publish(pending_ids())


class Relay:
    """A thread in each worker process that publishes what commits could not."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="jobs-outbox-relay", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)

    def _run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                while relay_once() and not self.stopping.is_set():
                    pass  # a full batch went out: look for more at once
            except Exception:
                logger.warning("Outbox relay pass failed; will try again", exc_info=True)
            finally:
                close_old_connections()
