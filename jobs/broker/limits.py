"""The size limit of a message, checked when it is sent (by the Payloads middleware
and by the outbox, in the request, so a huge payload never reaches Redis).

On the project's broker the check reads the bytes the broker sends
(``check_encoded``, called once every ``before_enqueue`` hook has run), so a
message is encoded once per send, and what is checked is the final message.

The limit is on what a producer sends: its arguments and options. What the
platform adds on the way (broker ids, retry bookkeeping, the last traceback) is
not counted, so a message that was accepted is never refused when Retries or a
paused queue puts it back, which would lose it: a refused re-enqueue is only
logged by Dramatiq, and the message is acked.
"""

from __future__ import annotations

import dataclasses
import json
from json.encoder import encode_basestring_ascii
from typing import Any

import dramatiq
from dramatiq.encoder import JSONEncoder
from dramatiq.middleware import MiddlewareError

from jobs.conf import jobs_settings
from jobs.errors import DEFERRALS

# Put back by a worker that did not know the actor (jobs.broker.unknown_actors).
UNKNOWN_ACTOR_REQUEUES = "unknown_actor_requeues"
# The key of a job whose actor declares a concurrency key, written by the
# sender for the fetch (jobs.concurrency.slots): the broker's, not the job's.
CONCURRENCY_KEY = "jobs_concurrency_key"
# Options set by the broker, Retries, the rate limiter and the pause control,
# never by a producer. Retries bounds the traceback (jobs.middleware.retries).
DELIVERY_OPTIONS = frozenset(
    {
        "redis_message_id",
        "eta",
        "retries",
        "traceback",
        "requeue_timestamp",
        DEFERRALS,
        "pause_requeues",
        UNKNOWN_ACTOR_REQUEUES,
        CONCURRENCY_KEY,
    }
)


class PayloadTooLarge(ValueError, MiddlewareError):
    """Refused at send time: the encoded message exceeds JOBS_MAX_PAYLOAD_BYTES."""


def check_size(message: dramatiq.Message[Any]) -> None:
    """Refuse ``message`` if what its producer sent encodes to more than the limit."""
    if not DELIVERY_OPTIONS.isdisjoint(message.options):
        options = {k: v for k, v in message.options.items() if k not in DELIVERY_OPTIONS}
        message = dataclasses.replace(message, options=options)
    _refuse_oversize(message, len(message.encode()))


def check_encoded(message: dramatiq.Message[Any], data: bytes) -> None:
    """``check_size`` for a message the broker has encoded as ``data`` already
    (``message.encode()``, delivery options included): the same size, the same
    refusal, without encoding the message a second time."""
    _refuse_oversize(message, _producer_size(message, data))


def _producer_size(message: dramatiq.Message[Any], data: bytes) -> int:
    delivery = [key for key in message.options if key in DELIVERY_OPTIONS]
    if not delivery:
        return len(data)
    if type(dramatiq.get_encoder()) is not JSONEncoder:
        # Another encoder's layout is unknown: encode the producer's part.
        options = {k: v for k, v in message.options.items() if k not in DELIVERY_OPTIONS}
        return len(dataclasses.replace(message, options=options).encode())
    # Dramatiq's JSON is compact: the options object is its `"key":value`
    # pairs joined by commas, so leaving the delivery ones out takes exactly
    # their own bytes and one comma each (one fewer if nothing is left).
    pairs = sum(_pair_size(key, message.options[key]) for key in delivery)
    commas = len(delivery) if len(message.options) > len(delivery) else len(delivery) - 1
    return len(data) - pairs - commas


def _pair_size(key: str, value: Any) -> int:
    """Bytes of ``"key":value`` as dramatiq.encoder.JSONEncoder writes it (ASCII)."""
    if type(value) is str:  # the broker's message id, a traceback: the C escaper
        return len(encode_basestring_ascii(key)) + 1 + len(encode_basestring_ascii(value))
    return len(json.dumps({key: value}, separators=(",", ":")).encode("utf-8")) - 2


def _refuse_oversize(message: dramatiq.Message[Any], size: int) -> None:
    if size > jobs_settings.JOBS_MAX_PAYLOAD_BYTES:
        raise PayloadTooLarge(
            f"{message.actor_name} message is {size} bytes; the limit is "
            f"{jobs_settings.JOBS_MAX_PAYLOAD_BYTES} (JOBS_MAX_PAYLOAD_BYTES). Pass ids, not data."
        )
