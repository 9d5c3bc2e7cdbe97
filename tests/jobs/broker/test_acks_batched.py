"""The held acks of a ledger batch go to Redis as one script call per queue
(jobs.broker.acks._ACK_MANY), with dispatch.lua's ack semantics: real Redis.

Before, each held ack was an EVALSHA of dispatch.lua of its own (13 arguments
for the writer thread to pack): this test's count of script calls was one per
message.
"""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
from dramatiq.common import current_millis

from jobs.broker.acks import _ACK_MANY, ACKS_PER_CALL, LedgerOrderedConsumer

QUEUE_A, QUEUE_B = "acks-batched-a", "acks-batched-b"
dramatiq.get_broker().declare_queue(QUEUE_A)
dramatiq.get_broker().declare_queue(QUEUE_B)


@dramatiq.actor(queue_name=QUEUE_A, max_retries=0)
def in_a(number: int) -> None:
    pass


@dramatiq.actor(queue_name=QUEUE_B, max_retries=0)
def in_b(number: int) -> None:
    pass


def _fetched(broker: Any, queue_name: str, n: int) -> tuple[LedgerOrderedConsumer, list[Any]]:
    """A consumer and the ``n`` messages it moved into this worker's ack set."""
    consumer = broker.consume(queue_name, prefetch=n, timeout=100)
    assert isinstance(consumer, LedgerOrderedConsumer)
    messages: list[Any] = []
    while len(messages) < n:
        message = next(consumer)
        if message is not None:
            messages.append(message)
    return consumer, messages


def _script_calls(client: Any) -> int:
    stats = client.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("evalsha", "eval"))


@pytest.mark.django_db(transaction=True)
def test_a_batch_of_held_acks_is_one_script_call_per_queue_with_dispatchs_semantics(broker):
    # Given 30 messages fetched from one queue and 5 from another, by this worker
    for n in range(30):
        in_a.send(n)
    for n in range(5):
        in_b.send(n)
    consumer_a, messages_a = _fetched(broker, QUEUE_A, 30)
    consumer_b, messages_b = _fetched(broker, QUEUE_B, 5)
    client, ns = broker.client, broker.namespace
    acks_a = f"{ns}:__acks__.{broker.broker_id}.{QUEUE_A}"
    # and one of them handed back meanwhile (maintenance found this worker
    # dead): in its queue again, not in this worker's ack set
    handed_back = messages_a[-1]
    broker.do_requeue(QUEUE_A, handed_back.options["redis_message_id"])
    # (loaded beforehand: a server's first call of a script is refused, then
    # loaded and sent again, which the count below would take for more calls)
    client.script_load(_ACK_MANY.source)
    before, started = _script_calls(client), current_millis()

    # When the writer sends the acks of a batch: all of them but one of each
    # queue (the handed-back message's too: it ran before the hand-back)
    held = [(consumer_a, m, "ack") for m in messages_a[1:]]
    held += [(consumer_b, m, "ack") for m in messages_b[1:]]
    assert broker.send_held_acks(held) == []

    # Then Redis ran one script per queue
    assert _script_calls(client) - before == 2
    # and each acked message left the ack set and its payload went with it
    assert client.smembers(acks_a) == {messages_a[0].options["redis_message_id"].encode()}
    for queue_name, kept in ((QUEUE_A, messages_a[0]), (QUEUE_B, messages_b[0])):
        payloads = client.hkeys(f"{ns}:{queue_name}.msgs")
        assert kept.options["redis_message_id"].encode() in payloads
    # but the payload of the handed-back message stays, for its next run
    assert client.hexists(f"{ns}:{QUEUE_A}.msgs", handed_back.options["redis_message_id"])
    assert client.hlen(f"{ns}:{QUEUE_A}.msgs") == 2
    assert client.hlen(f"{ns}:{QUEUE_B}.msgs") == 1
    # and the worker's heartbeat moved, as an ack through dispatch.lua moves it
    assert client.zscore(f"{ns}:__heartbeats__", broker.broker_id) >= started
    # and the consumers no longer count the acked messages as theirs
    assert consumer_a.queued_message_ids == {messages_a[0].message_id}
    consumer_a.close()
    consumer_b.close()


@pytest.mark.django_db(transaction=True)
def test_a_batch_larger_than_one_call_takes_is_split(broker):
    # Given more fetched messages of one queue than one script call takes
    n = ACKS_PER_CALL + 3
    for number in range(n):
        in_a.send(number)
    consumer, messages = _fetched(broker, QUEUE_A, n)
    broker.client.script_load(_ACK_MANY.source)
    before = _script_calls(broker.client)
    # When they are acked in one batch
    assert broker.send_held_acks([(consumer, m, "ack") for m in messages]) == []
    # Then it took two calls, and every payload is gone
    assert _script_calls(broker.client) - before == 2
    assert broker.client.hlen(f"{broker.namespace}:{QUEUE_A}.msgs") == 0
    consumer.close()


@pytest.mark.django_db(transaction=True)
def test_acks_reach_a_redis_that_lost_its_scripts(broker):
    # Given fetched messages, and a Redis restarted (or promoted) since: no script cached
    for number in range(3):
        in_b.send(number)
    consumer, messages = _fetched(broker, QUEUE_B, 3)
    broker.client.script_flush()
    # When their acks are sent, every payload is gone all the same
    assert broker.send_held_acks([(consumer, m, "ack") for m in messages]) == []
    assert broker.client.hlen(f"{broker.namespace}:{QUEUE_B}.msgs") == 0
    consumer.close()


@pytest.mark.django_db(transaction=True)
def test_acks_a_read_only_redis_refuses_are_sent_again_not_dropped(broker):
    # Given fetched messages, and their Redis made a replica (a failover seen
    # through a plain URL): every write is refused with READONLY
    for number in range(3):
        in_b.send(number)
    consumer, messages = _fetched(broker, QUEUE_B, 3)
    held = [(consumer, m, "ack") for m in messages]
    broker.client.execute_command("REPLICAOF", "127.0.0.1", "1")  # (a master that never answers)
    try:
        # When their acks are sent, they come back to be sent again (they raised)
        assert broker.send_held_acks(held) == held
    finally:
        broker.client.execute_command("REPLICAOF", "NO", "ONE")
    # Then, once it takes writes again, they go and every payload is gone
    assert broker.send_held_acks(held) == []
    assert broker.client.hlen(f"{broker.namespace}:{QUEUE_B}.msgs") == 0
    consumer.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("command", ["ack", "nack"])
def test_an_ack_or_nack_a_read_only_redis_refuses_is_retried_not_dropped(broker, command):
    # An ack the ledger does not hold (its job's events already written) goes
    # to Redis at once, from the worker thread. Refused with READONLY, it was
    # an unhandled error to Dramatiq, which dropped it: the job stayed in this
    # worker's ack set, to run again once the worker stopped. As a lost
    # connection, Dramatiq's post_process_message sends it again.
    in_b.send(1)
    consumer, [message] = _fetched(broker, QUEUE_B, 1)
    send = consumer.ack if command == "ack" else consumer.nack
    broker.client.execute_command("REPLICAOF", "127.0.0.1", "1")  # (a master that never answers)
    try:
        with pytest.raises(dramatiq.errors.ConnectionClosed):
            send(message)
    finally:
        broker.client.execute_command("REPLICAOF", "NO", "ONE")
    send(message)
    assert broker.client.hlen(f"{broker.namespace}:{QUEUE_B}.msgs") == 0
    assert broker.client.zcard(f"{broker.namespace}:{QUEUE_B}.XQ") == (command == "nack")
    assert not broker.client.smembers(f"{broker.namespace}:__acks__.{broker.broker_id}.{QUEUE_B}")
    consumer.close()
