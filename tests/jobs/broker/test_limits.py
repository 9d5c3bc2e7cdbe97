"""The size limit measured on the bytes the broker sends is the producer's size."""

from __future__ import annotations

import dataclasses
from typing import Any

import dramatiq
import pytest

from jobs.broker.limits import DELIVERY_OPTIONS, PayloadTooLarge, check_encoded, check_size


def _producer_size(message: dramatiq.Message[Any]) -> int:
    options = {k: v for k, v in message.options.items() if k not in DELIVERY_OPTIONS}
    return len(dataclasses.replace(message, options=options).encode())


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"max_retries": 3},
        {"redis_message_id": "3f2a"},
        {"redis_message_id": "3f2a", "eta": 1764530000000},
        {"max_retries": 3, "redis_message_id": "3f2a", "request_id": "r-1"},
        {"retries": 2, "traceback": 'Trace "é\\n"\u2028\ud800', "redis_message_id": "x"},
        {"pause_requeues": 1, "deferrals": 4, "requeue_timestamp": 1.5},
    ],
)
def test_the_encoded_check_measures_what_check_size_measures(
    settings, options: dict[str, Any]
) -> None:
    # Given a message with delivery options in any mix and order
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name="default",
        actor_name="demo",
        args=("ä", 1),
        kwargs={"k": [1, None]},
        options=dict(options),
    )
    size, data = _producer_size(message), message.encode()
    # When the limit is exactly the producer's size, Then both checks let it pass
    settings.JOBS_MAX_PAYLOAD_BYTES = size
    check_size(message)
    check_encoded(message, data)
    # When it is one byte less, Then both refuse it naming the same size
    settings.JOBS_MAX_PAYLOAD_BYTES = size - 1
    with pytest.raises(PayloadTooLarge, match=f"is {size} bytes"):
        check_size(message)
    with pytest.raises(PayloadTooLarge, match=f"is {size} bytes"):
        check_encoded(message, data)


@pytest.mark.parametrize(
    "delivery",
    [
        {"retries": 1, "traceback": "Traceback ...\nValueError: x"},
        {"deferrals": 1},  # a rate-limit or Retry deferral (jobs.errors.DEFERRALS)
        {"pause_requeues": 2, "requeue_timestamp": 1764530000000},
        {"redis_message_id": "3f2a", "eta": 1764530000000},
    ],
)
def test_a_message_the_producer_sent_at_the_limit_is_not_refused_when_delivered_again(
    settings, delivery: dict[str, Any]
) -> None:
    # Given a message its producer sent at exactly the limit
    sent: dramatiq.Message[Any] = dramatiq.Message(
        queue_name="default", actor_name="demo", args=("x" * 100,), kwargs={}, options={}
    )
    settings.JOBS_MAX_PAYLOAD_BYTES = len(sent.encode())
    check_size(sent)
    # When the platform re-enqueues it with its own bookkeeping (a retry, a
    # deferral, a paused queue's requeue, a delay)
    again = dataclasses.replace(sent, options={**sent.options, **delivery})
    # Then it is not refused: refusing would lose the job (after_* hooks only log)
    check_size(again)
    check_encoded(again, again.encode())


def test_the_concurrency_key_the_sender_writes_is_not_counted(settings: Any) -> None:
    # The broker writes each keyed job's key into its message (for the fetch);
    # a payload check before that (the outbox, in the request) and the one
    # after (the broker's enqueue) must agree, or the relay refuses for good
    # what the request accepted.
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name="default", actor_name="demo", args=("x" * 20,), kwargs={}, options={}
    )
    settings.JOBS_MAX_PAYLOAD_BYTES = len(message.encode())
    check_size(message)
    keyed = message.copy(options={"jobs_concurrency_key": "tenant:" + "x" * 20})
    assert "jobs_concurrency_key" in DELIVERY_OPTIONS
    check_encoded(keyed, keyed.encode())
