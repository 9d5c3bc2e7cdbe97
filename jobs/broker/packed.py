"""Hot commands packed by hand and sent on a pooled connection.

redis-py builds every command from its arguments on each call: 14 arguments,
each checked and encoded, then a retry wrapper, observability hooks and the
response callbacks. For the one command every ``send()`` makes, that was a
fifth of the sending process's cost (``python -m bench --only enqueue``; a
micro-benchmark measured 140 us -> 112 us per EVALSHA on loopback). Here the
parts that never change for a broker (script hash, namespace, broker id,
timeouts) are packed once, and a send packs only its own values. ``cached()``'s
hit (one MGET) goes the same way.

A command that never reached the server (``NotSent``: no connection, or cut
while being written) and a script missing from a restarted or promoted server
fall back to the client's own call, exactly as the stock broker sends (redis-py's
``Script`` loads the script). A reply that does not come back is raised to the
sender, as the stock broker does (its client makes no retries): the server may
have run the command, so sending it again could enqueue the message twice.
"""

from __future__ import annotations

from typing import Any

import redis


def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def _text(value: object) -> bytes:
    return _bulk(str(value).encode())


def pack(*parts: bytes) -> bytes:
    """RESP bytes of the command made of ``parts``."""
    return b"*%d\r\n%s" % (len(parts), b"".join(map(_bulk, parts)))


class NotSent(Exception):
    """The command never reached the server whole (no connection, or cut while
    being written): sending it again cannot run it twice."""


def send(client: redis.Redis, packed: bytes) -> Any:
    """Send ``packed`` on one of ``client``'s pooled connections and read its reply.

    Raises ``NotSent`` when the command was not written, and what redis-py
    raises once it was: a reply that never came (a timeout, a connection cut
    after the write) may still have run, and is the caller's to report, not
    to send again. The connection is dropped on any such error.
    """
    pool = client.connection_pool
    try:
        connection = pool.get_connection()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise NotSent(str(exc)) from exc
    try:
        try:
            connection.send_packed_command([packed])  # type: ignore[no-untyped-call]
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            connection.disconnect()  # type: ignore[no-untyped-call]
            raise NotSent(str(exc)) from exc
        try:
            return connection.read_response()
        except BaseException:
            # A reply may still be on its way: a connection left in the pool would
            # hand it to the next command as that command's answer (redis-py's
            # Sentinel connections do not disconnect on a read error themselves).
            connection.disconnect()  # type: ignore[no-untyped-call]
            raise
    finally:
        pool.release(connection)


class PackedEnqueue:
    """``EVALSHA <sha> 1 <namespace> enqueue <dispatch.lua arguments>`` as RESP bytes."""

    def __init__(
        self,
        client: redis.Redis,
        sha: str,
        namespace: str,
        broker_id: str,
        heartbeat_timeout: int,
        dead_message_ttl: int,
        max_unpack_size: int,
    ) -> None:
        self.client = client
        self._start = b"".join(
            (_text("EVALSHA"), _text(sha), _text(1), _text(namespace), _text("enqueue"))
        )
        self._worker = b"".join(
            (_text(broker_id), _text(heartbeat_timeout), _text(dead_message_ttl))
        )
        self._unpack = _text(max_unpack_size)

    def pack(
        self,
        timestamp: int,
        queue_name: str,
        maintenance: int,
        redis_message_id: str,
        data: bytes,
        extra: tuple[object, ...] = (),
    ) -> bytes:
        """The command for dispatch.lua's argument layout (``_dispatch_args``)."""
        return b"".join(
            (
                b"*%d\r\n" % (14 + len(extra)),
                self._start,
                _text(timestamp),
                _text(queue_name),
                self._worker,
                _text(maintenance),
                self._unpack,
                _text(redis_message_id),
                _bulk(data),
                *map(_text, extra),
            )
        )

    def send(self, packed: bytes) -> Any:
        return send(self.client, packed)
