"""The hand-packed enqueue command (``jobs.broker.packed``) on a real Redis."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any
from urllib.parse import urlsplit

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
    # (a connection of the pool's kind, never connected: packing needs no server)
    connection: Any = redis.Connection(**broker.client.connection_pool.connection_kwargs)  # type: ignore[no-untyped-call]
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


class DelayingProxy:
    """A TCP proxy to Redis that holds back the next reply once armed (a slow
    network or a stalled server, seen from the client)."""

    def __init__(self, upstream: int, delay: float) -> None:
        self.upstream, self.delay = upstream, delay
        self.armed = threading.Event()
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.server.accept()
                upstream = socket.create_connection(("127.0.0.1", self.upstream))
                threading.Thread(
                    target=self._pipe, args=(client, upstream, False), daemon=True
                ).start()
                threading.Thread(
                    target=self._pipe, args=(upstream, client, True), daemon=True
                ).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, replies: bool) -> None:
        with contextlib.suppress(OSError), source, sink:
            while data := source.recv(65536):
                if replies and self.armed.is_set():
                    self.armed.clear()
                    time.sleep(self.delay)
                sink.sendall(data)


def test_a_reply_that_comes_too_late_is_an_error_not_a_second_enqueue(redis_server: str) -> None:
    # Given a broker whose client waits 0.5 s for a reply, behind a link that
    # will hold back one reply for 1.5 s (the server runs the command at once)
    port = urlsplit(redis_server).port
    assert port is not None
    proxy = DelayingProxy(port, delay=1.5)
    slow = WakeupRedisBroker(url=f"redis://127.0.0.1:{proxy.port}/0?socket_timeout=0.5")
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=QUEUE, actor_name="note", args=("a",), kwargs={}, options={}
    )
    slow.enqueue(message)

    # When a send's reply comes too late
    proxy.armed.set()
    with pytest.raises(redis.TimeoutError):
        slow.enqueue(message.copy(args=("b",)))
    time.sleep(2)  # the held reply, then nothing more

    # Then the sender was told, as the stock broker tells it, and the message
    # is in its queue once: no second send of a command that may have run
    assert sorted(m.args[0] for m in queued_messages(QUEUE)) == ["a", "b"]
    proxy.server.close()


class _KeepsConnectionOnReadError(redis.Connection):
    """A connection that stays open after a read error, as redis-py's Sentinel
    connection does (SentinelManagedConnection reads with disconnect_on_error=False)."""

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["disconnect_on_error"] = False
        return super().read_response(*args, **kwargs)


def test_a_timed_out_reply_never_answers_the_next_command(tmp_path: Any) -> None:
    from jobs.broker import packed
    from project.redis_server import RedisServer
    from tests.e2e.conftest import free_port

    # Given a Redis that stalls past the client's read timeout, on a pool whose
    # connections keep their socket after a read error
    server = RedisServer(free_port(), tmp_path / "redis", appendonly=False).start()
    assert server.process is not None
    try:
        pool = redis.ConnectionPool(
            port=server.port,
            socket_timeout=0.5,
            connection_class=_KeepsConnectionOnReadError,
            max_connections=1,
        )
        client = redis.Redis(connection_pool=pool)
        client.mset({"x": "answer-to-x", "y": "answer-to-y"})
        import os
        import signal

        os.kill(server.process.pid, signal.SIGSTOP)
        threading.Timer(1.0, os.kill, (server.process.pid, signal.SIGCONT)).start()
        # When a GET x times out and its reply arrives late
        with pytest.raises(redis.TimeoutError):
            packed.send(client, packed.pack(b"GET", b"x"))
        time.sleep(1.5)
        # Then the next command on the pool reads its own reply, not x's
        assert packed.send(client, packed.pack(b"GET", b"y")) == b"answer-to-y"
    finally:
        server.stop()
