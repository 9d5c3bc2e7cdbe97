"""The size limit of a message, checked when it is sent (by the Payloads middleware
and by the outbox, in the request, so a huge payload never reaches Redis).

The limit is on what a producer sends: its arguments and options. What the
platform adds on the way (broker ids, retry bookkeeping, the last traceback) is
not counted, so a message that was accepted is never refused when Retries or a
paused queue puts it back, which would lose it: a refused re-enqueue is only
logged by Dramatiq, and the message is acked.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import dramatiq
from django.conf import settings
from dramatiq.middleware import MiddlewareError

# Options set by the broker, Retries, the rate limiter and the pause control,
# never by a producer. Retries bounds the traceback (jobs.middleware.retries).
DELIVERY_OPTIONS = frozenset(
    {
        "redis_message_id",
        "eta",
        "retries",
        "traceback",
        "requeue_timestamp",
        "rate_limit_deferrals",
        "pause_requeues",
    }
)


class PayloadTooLarge(ValueError, MiddlewareError):
    """Refused at send time: the encoded message exceeds JOBS_MAX_PAYLOAD_BYTES."""


def check_size(message: dramatiq.Message[Any]) -> None:
    if not DELIVERY_OPTIONS.isdisjoint(message.options):
        options = {k: v for k, v in message.options.items() if k not in DELIVERY_OPTIONS}
        message = dataclasses.replace(message, options=options)
    size = len(message.encode())
    if size > settings.JOBS_MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"{message.actor_name} message is {size} bytes; the limit is "
            f"{settings.JOBS_MAX_PAYLOAD_BYTES} (JOBS_MAX_PAYLOAD_BYTES). Pass ids, not data."
        )
