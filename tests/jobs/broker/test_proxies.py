"""The project's consumer hands out messages whose fields are plain attributes
(jobs.broker.proxies): read without MessageProxy.__getattr__, same values.

Before, every read of ``message.message_id``, ``message.options``, ... by a
middleware went through ``__getattr__`` after a failed normal lookup: about 30
us of a worker thread's time per job (issue 17).
"""

from __future__ import annotations

from typing import Any

import dramatiq

from jobs.broker.proxies import FIELDS

QUEUE = "proxies-test"
dramatiq.get_broker().declare_queue(QUEUE)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def greet_for_proxies(name: str, *, loud: bool = False) -> None:
    pass


class _NoForwarding(dramatiq.MessageProxy):
    """A proxy that fails on any field read forwarded through ``__getattr__``."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"{name} read through __getattr__")


def test_a_consumed_message_has_its_fields_as_attributes_of_the_proxy(
    broker: dramatiq.Broker,
) -> None:
    # Given a message sent with arguments and options
    sent = greet_for_proxies.send_with_options(args=("ada",), kwargs={"loud": True}, max_retries=3)
    consumer = broker.consume(QUEUE, prefetch=1, timeout=100)
    try:
        # When the project's consumer hands it out
        received = None
        while received is None:
            received = next(consumer)
        # Then every field reads without forwarding, with the message's value
        received.__class__ = _NoForwarding
        assert set(FIELDS) == {
            "queue_name",
            "actor_name",
            "args",
            "kwargs",
            "options",
            "message_id",
            "message_timestamp",
        }
        for name in FIELDS:
            assert getattr(received, name) == getattr(received._message, name), name
        assert received.message_id == sent.message_id
        assert received.args == ("ada",)
        assert received.kwargs == {"loud": True}
        # and options stay the message's own dict: a middleware's change is seen through both
        received.options["noted"] = 1
        assert received._message.options["noted"] == 1
        consumer.ack(received)
    finally:
        consumer.close()


def test_the_proxys_own_state_and_equality_are_dramatiqs(broker: dramatiq.Broker) -> None:
    greet_for_proxies.send("bob")
    consumer = broker.consume(QUEUE, prefetch=1, timeout=100)
    try:
        received = None
        while received is None:
            received = next(consumer)
        assert received.failed is False
        received.fail()
        received.stuff_exception(ValueError("x"))
        assert received.failed is True
        assert isinstance(received._exception, ValueError)
        assert received == received._message
        consumer.ack(received)
    finally:
        consumer.close()
