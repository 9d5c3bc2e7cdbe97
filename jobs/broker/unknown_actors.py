"""A message for an actor this worker does not know: during a rolling deploy,
a new version's job fetched by an old worker.

Dramatiq dead-letters it at once, before any middleware sees it, so the job
failed for good with no ledger row while a worker that knows it was starting
up. Here the consumer puts it back instead: the same message, delayed by
``JOBS_PAUSE_RECHECK_MS``, for a worker that knows the actor. The copy and
the fetched message's ack are one Redis transaction: a worker killed between
the two would otherwise leave both, and the job would run twice. The copy is
recorded through the ledger intake, which only a process that knows the actor
drains. Past
``JOBS_UNKNOWN_ACTOR_WAIT_MS`` since it was first sent (no deploy brought the
actor), it is dead-lettered with a ledger row saying so: the admin shows it
failed, and its Retry button sends it again once the actor exists.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import dramatiq
from dramatiq.common import q_name

from jobs.broker.limits import UNKNOWN_ACTOR_REQUEUES
from jobs.conf import jobs_settings

if TYPE_CHECKING:
    from jobs.broker.wakeup import WakeupRedisBroker

logger = logging.getLogger(__name__)

# Message option: how often a worker that did not know the actor put it back
# (a delivery option: not counted by the size limit, dropped by a retry).
REQUEUES = UNKNOWN_ACTOR_REQUEUES
_warned: dict[str, float] = {}
WARN_EVERY_S = 60.0


def is_unknown(
    broker: dramatiq.Broker, message: dramatiq.Message[Any] | dramatiq.MessageProxy
) -> bool:
    return message.actor_name not in broker.actors


def put_back(broker: WakeupRedisBroker, message: dramatiq.MessageProxy, fetched_from: str) -> bool:
    """Send ``message`` again, delayed, for a worker that knows its actor, and
    ack it on ``fetched_from`` in the same transaction; True if put back, False
    (nothing sent) once it waited too long: then dead-letter it."""
    age_ms = time.time() * 1000 - message.message_timestamp
    if age_ms > jobs_settings.JOBS_UNKNOWN_ACTOR_WAIT_MS:
        logger.error(
            "No worker ran actor %r within %.0f s of message %s being sent: dead-lettered. "
            "Deploy the actor, then retry the job from the admin.",
            message.actor_name,
            age_ms / 1000,
            message.message_id,
        )
        return False
    trips = int(message.options.get(REQUEUES, 0)) + 1
    copy: dramatiq.Message[Any] = message.copy(
        queue_name=q_name(message.queue_name), options={REQUEUES: trips}
    )
    broker.enqueue(
        copy,
        delay=jobs_settings.JOBS_PAUSE_RECHECK_MS,
        replacing=(fetched_from, message.options["redis_message_id"]),
    )
    now = time.monotonic()
    if now - _warned.get(message.actor_name, float("-inf")) >= WARN_EVERY_S:
        _warned[message.actor_name] = now
        logger.warning(
            "This worker does not know actor %r (a rolling deploy?): its messages go back "
            "to queue %s for a worker that does, every %d ms, for up to %d s",
            message.actor_name,
            q_name(message.queue_name),
            jobs_settings.JOBS_PAUSE_RECHECK_MS,
            jobs_settings.JOBS_UNKNOWN_ACTOR_WAIT_MS // 1000,
        )
    return True


def failure_event(message: dramatiq.Message[Any] | dramatiq.MessageProxy) -> Any:
    """The ledger's "failed" event for a message dead-lettered here. Its arguments
    are not recorded: without the actor, no parameter name tells a secret."""
    from datetime import UTC, datetime

    from jobs.ledger import states
    from jobs.ledger.redaction import REDACTED
    from jobs.ledger.writer import TERMINAL, Event

    now = datetime.now(UTC)
    text = (
        f"No worker knows actor {message.actor_name!r}: dead-lettered after "
        f"{jobs_settings.JOBS_UNKNOWN_ACTOR_WAIT_MS // 1000} s. Its arguments are kept in "
        "the dead-letter set only; deploy the actor, then retry."
    )
    create = {
        "actor_name": message.actor_name,
        "queue_name": q_name(message.queue_name),
        # A marker, not []: once the dead letter expires, the admin's retry
        # must refuse to send the job without its arguments.
        "args": [REDACTED],
        "kwargs": {},
        "options": {},
        "enqueued_at": datetime.fromtimestamp(message.message_timestamp / 1000, UTC),
        "max_attempts": 1,
    }
    update = {
        "finished_at": now,
        "error_type": "ActorNotFound",
        "error_class_path": "dramatiq.errors.ActorNotFound",
        "error_message": text,
        "redis_message_id": message.options.get("redis_message_id", ""),
    }
    return Event(message.message_id, states.FAILED, TERMINAL, create, update)
