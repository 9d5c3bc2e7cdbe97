"""The hand-packed enqueue command (``jobs.broker.packed``) on a real Redis."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
import redis

from jobs.broker.wakeup import WakeupRedisBroker
from tests.conftest import queued_messages

QUEUE = "packed-test"


@dramatiq.actor(queue_name=QUEUE)
def note(text: str) -> None:
    pass


def test_it_packs_the_bytes_redis_py_would_send(broker: WakeupRedisBroker) -> None:
    # Given the arguments of one enqueue, with a non-ASCII queue name and a
    # binary payload (lengths are counted in bytes)
    data = '{"text": "héllo"}'.encode() + b"\x00\xff"
    packed = broker._packed or broker._pack_enqueue()
    args = broker._dispatch_args("enqueue", "queue-é", "id-1", data)

    # Then our bytes are redis-py's own packing of the same EVALSHA
    connection = broker.client.connection_pool.make_connection()
    expected = b"".join(
        connection.pack_command("EVALSHA", broker._enqueue_script.sha, 1, broker.namespace, *args)
    )
    mine = packed.pack(args[1], "queue-é", args[6], "id-1", data)
    assert mine == expected
    # With the intake flag too
    expected_flagged = b"".join(
        connection.pack_command(
            "EVALSHA", broker._enqueue_script.sha, 1, broker.namespace, *args, 1
        )
    )
    assert packed.pack(args[1], "queue-é", args[6], "id-1", data, (1,)) == expected_flagged


def test_a_redis_that_lost_its_scripts_still_takes_the_send(broker: WakeupRedisBroker) -> None:
    # Given a broker that has sent once, then a Redis restart's empty script cache
    note.send("first")
    broker.client.script_flush()

    # When it sends again, the message is enqueued once (the client loads the script)
    note.send("second")

    assert sorted(m.args[0] for m in queued_messages(QUEUE)) == ["first", "second"]


def test_a_pooled_connection_the_server_closed_is_replaced_without_a_duplicate(
    broker: WakeupRedisBroker, redis_server: str
) -> None:
    # Given a pooled connection that the server has since closed (a timeout or
    # a restart on the server side); the pool checks it out only after a
    # reconnect, so the packed send needs no fallback for this one
    note.send("first")
    killer: Any = redis.Redis.from_url(redis_server)
    try:
        assert killer.client_kill_filter(_type="normal", skipme=True) >= 1
    finally:
        killer.close()

    # When the next send goes out, it reconnects and sends exactly once
    note.send("second")

    assert sorted(m.args[0] for m in queued_messages(QUEUE)) == ["first", "second"]


@pytest.mark.parametrize("size", [0, 1, 127, 60_000])
def test_payloads_of_any_size_arrive_intact(broker: WakeupRedisBroker, size: int) -> None:
    text = "x" * size
    note.send(text)
    assert [m.args[0] for m in queued_messages(QUEUE)] == [text]
