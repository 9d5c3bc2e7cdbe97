"""The transactional outbox: a job asked for in a transaction is never lost.

    with transaction.atomic():
        user = User.objects.create_user(...)
        send_on_commit(send_welcome_email, user.pk)

The message is written to ``OutboxMessage`` inside the caller's transaction, so
a rollback leaves nothing to send, and a commit leaves a row that must be sent.
Right after commit it is published; if the broker is unreachable then, the
request still succeeds, and the relay thread in every worker process publishes
pending rows with backoff until the broker is back.

Each publish writes a marker key in the enqueue script itself, and the script
enqueues only if the marker was not there (``jobs.broker.wakeup``): a message
is taken once per marker, however often it is sent. A publish whose reply never
came (a request's short timeout on a slow Redis, a relay killed before it
marked the row sent) is settled by the relay's next look, which finds the
marker; a copy still on its way when the relay looked does nothing when it
arrives. Markers expire (an hour past the message's delay; a day while a
replica has not confirmed). Only a Redis that lost both (a restart without
persistence, a failover, below) gets the message again; both copies then carry
the same message id, and the actors' idempotency keys (``run_once`` /
``once_atomic``) keep the effect single.

Redis replicates asynchronously: a primary that dies right after taking a
message may not have passed it to its replica, and Sentinel then promotes a
replica without it. With ``JOBS_OUTBOX_WAIT_REPLICAS`` (1 by default under
Sentinel) a row is marked sent only once that many replicas confirmed the
message (``WAIT``, in the enqueue's own round trip, with a marker written right
after the message: ``jobs.broker.replication``); otherwise it stays pending.
The relay never sends such a message twice. It settles the row when the ledger
saw the job start (it was not lost), or when the primary still holds the marker
and a replica now confirms it; while the primary alone holds the marker it only
looks again later. Only a primary without the marker (a failover promoted a
replica that never got the message, or the first publish never reached Redis)
gets the message again.

A request does not wait for a replica the primary does not have: with fewer
replicas online than asked for, or for a few seconds after a WAIT timed out,
the commit publishes without waiting and leaves the confirmation to the relay.
Why not mark such a row sent instead: a replica cut off from the primary (not
dead) is not counted online, yet Sentinel may still promote it, without the
message; the row then still stands, and the relay sends the message again.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

import dramatiq
from django.db import close_old_connections, transaction
from django.db.models import F, Q
from django.utils import timezone
from dramatiq.brokers.redis import RedisBroker

from jobs.broker import redis_broker, replication
from jobs.broker.limits import check_size
from jobs.conf import jobs_settings
from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable
from jobs.ledger.storable import unstorable
from jobs.models import Job, OutboxMessage
from jobs.observability import logcontext

logger = logging.getLogger(__name__)
CLAIM = timedelta(seconds=30)
BATCH = 200
_ETA = "outbox_eta"
# Written with each message the outbox sends while it waits for replicas
# (jobs.broker.replication): "this primary took it". Lasts the message's delay
# plus this, renewed at each relay visit, deleted once the row is settled.
MARKER_PREFIX = "jobs:outbox:held:"
MARKER_KEEP_MS = 24 * 3600 * 1000
# Without replicas to wait for, every publish leaves a marker: an hour bounds
# their memory (a key per message) and outlasts the relay's backoff and a
# copy delayed in the network.
SINGLE_MARKER_KEEP_MS = 3600 * 1000


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
    """Publish the given rows (those still pending and unclaimed); return how many
    are settled: sent and confirmed, or known to have reached a worker."""
    sent = 0
    if recently_unreachable():
        # Redis just failed to answer this process: the rows stay pending, and a
        # worker's relay publishes them (a request does not wait on Redis again).
        return 0
    broker = redis_broker()
    for row_id in row_ids:
        row = _claim(row_id)
        if row is None:
            continue
        try:
            _publish_row(broker, row)
        except Exception as exc:
            if isinstance(exc, UNREACHABLE):
                note_unreachable(exc)
            _retry_later(row, exc)
            continue
        OutboxMessage.objects.filter(pk=row.pk).update(sent_at=timezone.now(), claimed_until=None)
        sent += 1
    return sent


def _publish_row(broker: RedisBroker, row: OutboxMessage) -> None:
    """Send the row's message unless Redis holds it already; raise unless confirmed."""
    replicas = jobs_settings.JOBS_OUTBOX_WAIT_REPLICAS
    timeout_ms = jobs_settings.JOBS_OUTBOX_WAIT_TIMEOUT_MS
    options = dict(row.payload.get("options", {}))
    eta, now = options.pop(_ETA, None), time.time() * 1000
    delay = None if eta is None or eta <= now else int(eta - now)
    # The marker must outlast the message's delay and the relay's visits (and
    # a copy still on its way: it is never deleted, it expires).
    keep_ms = (delay or 0) + (MARKER_KEEP_MS if replicas else SINGLE_MARKER_KEEP_MS)
    if row.attempts > 1:
        if _ledger_saw_it_start(row.message_id):
            return  # an earlier publish reached a worker: it survived
        marker = _marker(row.message_id)
        if replication.confirm_held(
            broker.client, marker, replicas=replicas, timeout_ms=timeout_ms, keep_ms=keep_ms
        ):
            return  # the primary still holds the earlier publish: never a second copy
        # Never reached Redis, or a failover promoted a replica without it: send.
    with replication.confirmed_by_replicas(
        replicas, timeout_ms, marker=_marker(row.message_id), keep_ms=keep_ms
    ):
        broker.enqueue(dramatiq.Message(**{**row.payload, "options": options}), delay=delay)


def _retry_later(row: OutboxMessage, exc: Exception) -> None:
    retry_at = timezone.now() + _backoff(row.attempts)
    OutboxMessage.objects.filter(pk=row.pk).update(
        claimed_until=retry_at, last_error=f"{type(exc).__name__}: {exc}"[:2000]
    )
    # Published but not yet on a replica: the replica gauge warns once, not per row.
    unconfirmed = isinstance(exc, replication.ReplicationNotConfirmed)
    (logger.debug if unconfirmed else logger.warning)(
        "Outbox: %s %s (attempt %d) not settled, looking again at %s: %s",
        row.actor_name,
        row.message_id,
        row.attempts,
        retry_at.isoformat(),
        exc,
    )


def _marker(message_id: str) -> str:
    return f"{MARKER_PREFIX}{message_id}"


def _ledger_saw_it_start(message_id: str) -> bool:
    return Job.objects.filter(message_id=message_id, started_at__isnull=False).exists()


def pending_ids(limit: int = BATCH) -> list[int]:
    """Rows due for the relay: unsent, unclaimed, and past the committer's own try."""
    now = timezone.now()
    grace = timedelta(milliseconds=jobs_settings.JOBS_OUTBOX_GRACE_MS)
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
