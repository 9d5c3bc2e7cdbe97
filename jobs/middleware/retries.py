"""Retries with exponential backoff that tell permanent failures from transient.

Dramatiq's stock middleware retries every exception. Ours reads its defaults
from Django settings (``JOBS_MAX_RETRIES``, ``JOBS_MIN_BACKOFF_MS``,
``JOBS_MAX_BACKOFF_MS``) and never retries a ``PermanentJobError``, whatever the
actor's ``throws`` says. The schedule is Dramatiq's: retry *n* waits between
``min * 2**(n-1)`` and twice that (jitter, so a burst of failures does not come
back in lock-step): 5-10 s, 10-20 s, 20-40 s ... for a 5 s minimum.

The retry carries the failure's traceback in its options. An error message can
quote a whole payload, so only its end is kept: the message stays small in
Redis, and the size limit (which does not count it) never refuses the retry.
Every attempt's own traceback is kept in the ledger (``JobAttempt``).

A retry (or deferral) waits for a replica to hold it when the outbox does
(``JOBS_OUTBOX_WAIT_REPLICAS``, ``jobs.broker.replication``), so a primary that
dies before passing it on cannot take the only copy with it. A retry that
Redis does not take (unreachable: a restart, a failover under way) must not let
the message be acked: Dramatiq would log the
error and ack it, and the job would be gone with its ledger row left "running".
The message is marked ``GIVE_BACK`` instead, and the consumer puts it back in
its queue in place of the ack (``jobs.broker.acks``), retrying until Redis
answers: it runs again as soon as a primary takes it.

A deferral (``jobs.errors.Deferred``, e.g. a full rate limit, or Dramatiq's own
``RateLimitExceeded``) is not a failure: the message goes back with the
deferral's delay as the same attempt, whatever ``max_retries`` says, and counts
one more deferral of that attempt (the ledger orders its events by it).
"""

from __future__ import annotations

import logging
import random
from typing import Any

import dramatiq
import redis
from dramatiq.broker import Broker, MessageProxy
from dramatiq.middleware import retries as stock

from jobs.broker import replication
from jobs.broker.acks import GIVE_BACK, give_back_token
from jobs.conf import jobs_settings
from jobs.errors import DEFERRALS, is_cancel, is_deferral, is_permanent

logger = logging.getLogger(__name__)

MAX_TRACEBACK_CHARS = 4000


class Retries(stock.Retries):
    def __init__(self, **options: Any) -> None:
        options.setdefault("max_retries", jobs_settings.JOBS_MAX_RETRIES)
        options.setdefault("min_backoff", jobs_settings.JOBS_MIN_BACKOFF_MS)
        options.setdefault("max_backoff", jobs_settings.JOBS_MAX_BACKOFF_MS)
        super().__init__(**options)

    def after_process_message(
        self,
        broker: Broker,
        message: MessageProxy,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        if exception is None:
            return
        if is_cancel(exception):
            # An operator stopped it: not a failure to try again, and not one
            # to dead-letter either (acked; the ledger records "cancelled").
            self.logger.info("Message %r cancelled while running.", message.message_id)
            return
        try:
            # The retry is confirmed by a replica, as the outbox's messages are:
            # a primary that dies before passing it on fails the WAIT (a
            # connection error: the message goes back, below) instead of
            # answering and taking the only copy with it.
            with replication.confirmed_by_replicas(
                jobs_settings.JOBS_OUTBOX_WAIT_REPLICAS, jobs_settings.JOBS_OUTBOX_WAIT_TIMEOUT_MS
            ):
                self._retry(broker, message, exception)
        except replication.ReplicationNotConfirmed as exc:
            # The primary has the retry and lives; a replica is late or away.
            # Giving the message back as well would run the job twice.
            logger.warning(
                "Retry of message %r not confirmed by a replica: %s", message.message_id, exc
            )
        except redis.RedisError as exc:
            logger.warning(
                "Could not enqueue the retry of message %r (%s); the message goes back "
                "to its queue instead.",
                message.message_id,
                exc,
            )
            message.options[GIVE_BACK] = give_back_token()

    def _retry(self, broker: Broker, message: MessageProxy, exception: BaseException) -> None:
        if is_deferral(exception):
            self._defer(broker, message, exception)
            return
        # A new attempt (or none) follows: its deferrals start from zero.
        message.options.pop(DEFERRALS, None)
        if is_permanent(exception):
            self.logger.warning(
                "Permanent failure of message %r (%s): not retried.",
                message.message_id,
                exception,
            )
            message.fail()
            return
        super().after_process_message(  # type: ignore[no-untyped-call]
            broker, message, exception=exception
        )

    def before_enqueue(self, broker: Broker, message: dramatiq.Message[Any], delay: int) -> None:
        # The stock middleware sets the traceback just before it re-enqueues;
        # the message here is the copy that is about to be encoded and sent.
        traceback = message.options.get("traceback")
        if isinstance(traceback, str) and len(traceback) > MAX_TRACEBACK_CHARS:
            message.options["traceback"] = "...\n" + traceback[-MAX_TRACEBACK_CHARS:]

    def _defer(self, broker: Broker, message: MessageProxy, exception: BaseException) -> None:
        delay = exception.delay if isinstance(exception, dramatiq.Retry) else None
        if delay is None:
            # RateLimitExceeded carries no delay: wait about the minimum backoff.
            actor = broker.get_actor(message.actor_name)
            least = message.options.get("min_backoff", actor.options.get("min_backoff"))
            least = int(least or self.min_backoff)
            delay = random.randint(least, 2 * least)
        # "retries" stays as it is; set to 0 on a first attempt so the message
        # reads as put back, not newly sent (jobs_enqueued_total skips it).
        message.options.setdefault("retries", 0)
        message.options[DEFERRALS] = message.options.get(DEFERRALS, 0) + 1
        self.logger.debug("Deferring message %r by %d ms.", message.message_id, delay)
        deferred: dramatiq.Message[Any] = message.copy()
        broker.enqueue(deferred, delay=delay)
