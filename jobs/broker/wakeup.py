"""A RedisBroker whose idle workers wake up the moment a message is enqueued.

Dramatiq's Redis consumer polls: when its queue is empty it sleeps with a
growing backoff up to the worker timeout (1 s by default), so a job enqueued to
an idle worker waits ~150 ms at the median and up to the timeout. Here the
producer also pushes a wake-up token onto ``<ns>:<queue>.wake`` in the same
script as the enqueue (``_WAKE_ON_ENQUEUE``), and an idle consumer waits on that list with
``BLPOP`` for the time it would have slept. Nothing else changes: messages,
acks, heartbeats and maintenance (requeue of a dead worker's messages) all
still go through Dramatiq's ``dispatch`` script at the same cadence, so the
delivery guarantees are Dramatiq's own.

Why no wake-up can be lost: the token is pushed with the message, and a
consumer only waits after a fetch that found nothing, so a message enqueued
after that fetch leaves a token behind that ends the wait (or finds the list
full, and a wait on a list that holds tokens ends at once). Tokens left over
while every worker was busy are harmless (a spurious wake-up costs one empty
fetch, and idle consumers take them within moments); the list holds at most
``WAKE_LIST_MAX``, so it cannot grow without bound. The tokens of a queue no
wake-up consumer reads stay in that one key until a consumer comes.

``DRAMATIQ_BROKER["OPTIONS"]["instant_wakeup"] = False`` restores the stock
consumer's polling (no tokens, sleep instead of BLPOP); acks still follow the
ledger write either way (``jobs.broker.acks``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any
from uuid import uuid4

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff, current_millis, dq_name
from dramatiq.errors import ConnectionClosed

from jobs.broker import clock, replication
from jobs.broker.acks import UNREACHABLE, HeldAcks, LedgerOrderedConsumer, queue_ack
from jobs.broker.hooks import QuietHooks
from jobs.broker.packed import NotSent, PackedEnqueue
from jobs.broker.sentinel import master_client
from jobs.concurrency import fairness, slots, takes
from jobs.concurrency import keys as concurrency_keys

logger = logging.getLogger(__name__)

# More tokens than idle consumers of one queue are never useful: each wakes one
# consumer, and a woken consumer fetches up to its prefetch.
WAKE_LIST_MAX = 64
# Put before dispatch.lua's own text: the enqueue and its wake-up token in one
# script, one command (three separate token commands cost each enqueue about
# as much again as the enqueue itself). Atomic, so no consumer sees the token
# before the message. A full list gets no token: no consumer waits while the
# list holds any (BLPOP returns at once), and under load, where no consumer
# waits, the list stays full, so the enqueue pays one LLEN rather than a push,
# a trim and an expiry (7% of the enqueue rate, a quarter more Redis CPU).
# The list has no expiry: 64 tokens are all it ever holds, idle consumers take
# leftovers within moments, and a full list left to expire under a steady load
# would vanish between a consumer's empty fetch and its BLPOP, so a message
# enqueued meanwhile (no token: the list was full) would wait for the backoff.
_WAKE_ON_ENQUEUE = f"""
if ARGV[1] == "enqueue" then
    local wake = KEYS[1] .. ":" .. ARGV[3] .. ".wake"
    if redis.call("llen", wake) < {WAKE_LIST_MAX} then
        redis.call("lpush", wake, 1)
    end
end
"""


# Also before dispatch.lua: a first send's entry in the ledger intake
# (jobs.ledger.intake), in the same atomic command as the message. ARGV[11] is
# ours; dispatch.lua's enqueue reads only its first two arguments after ARGV[8].
_INTAKE_ON_ENQUEUE = """
if ARGV[1] == "enqueue" and ARGV[11] == "1" then
    redis.call("rpush", KEYS[1] .. ":ledger.intake", ARGV[3] .. "\\n" .. ARGV[9])
end
"""


# First of all in the enqueue script: a message sent with a marker
# (jobs.broker.replication: the outbox) is enqueued only if its marker is not
# there yet, and the marker is written in the same atomic step. A copy sent
# again (a relay after a lost reply, a request's bytes that arrived after the
# relay looked) then does nothing. ARGV[12], ARGV[13]: the marker and its TTL
# ("" when there is none but a fairness key follows).
_ONCE_PER_MARKER = """
if ARGV[1] == "enqueue" and ARGV[12] and ARGV[12] ~= "" then
    if not redis.call("set", ARGV[12], 1, "NX", "PX", ARGV[13]) then
        -- Taken before. Written again, so that a WAIT after this command
        -- counts the replicas holding the marker (and the message before it).
        redis.call("set", ARGV[12], 1, "XX", "PX", ARGV[13])
        return 0
    end
end
"""


# Connections the broker's pool may open. Each idle consumer holds one for its
# wait (BLPOP on its wake list), and a worker runs two consumers per queue (the
# queue and its delay queue) besides its threads: redis-py's default cap of 100
# made a worker of about 45 queues fail every command past it with
# MaxConnectionsError. The pool opens connections only as they are used.
MIN_POOL_CONNECTIONS = 2_000


def _room_for_every_consumer(client: Any) -> None:
    """Raise the pool's cap to ``MIN_POOL_CONNECTIONS`` unless the URL (the
    ``max_connections`` option) asked for more."""
    pool = client.connection_pool
    if pool.max_connections < MIN_POOL_CONNECTIONS:
        pool.max_connections = MIN_POOL_CONNECTIONS


def wake_key(namespace: str, queue_name: str) -> str:
    return f"{namespace}:{queue_name}.wake"


class WakeupRedisBroker(QuietHooks, HeldAcks, RedisBroker):
    """RedisBroker + wake-up tokens + acks that follow the ledger write
    (``jobs.broker.acks``) + hooks called only where defined
    (``jobs.broker.hooks``). ``instant_wakeup=False`` polls like the stock broker."""

    # Read by the ledger middleware: our consumers hold acks, no thread waits.
    acks_after_ledger = True
    # Read by the Payloads middleware: enqueue() hands it the encoded message.
    calls_check_encoded = True
    # Read by the Ledger middleware: the enqueue script records the messages it
    # asks for (``in_ledger_intake``) in the Redis intake.
    ledger_intake = True

    def __init__(
        self,
        *,
        instant_wakeup: bool = True,
        sentinels: list[tuple[str, int]] | None = None,
        sentinel_master: str | None = None,
        **options: Any,
    ) -> None:
        if sentinels and sentinel_master:
            # The URL keeps giving the db number, password and timeouts; the
            # host comes from the Sentinels, asked again after every failover.
            url = options.pop("url")
            options["client"] = master_client(sentinels, sentinel_master, url)
        super().__init__(**options)  # type: ignore[no-untyped-call]
        _room_for_every_consumer(self.client)
        self.instant_wakeup = instant_wakeup
        wake = _WAKE_ON_ENQUEUE if instant_wakeup else ""
        # Every dispatch (fetch, ack, nack, maintenance, enqueue) on Redis's
        # clock, with no verdict on workers right after an outage.
        # Fair queues (jobs.concurrency.fairness): tickets turned into message
        # ids before a fetch, key lists enqueued to and purged.
        # Slots of keyed jobs taken in the fetch (jobs.concurrency.slots).
        dispatch_lua = self.scripts["dispatch"].script
        dispatch_lua = dispatch_lua if isinstance(dispatch_lua, str) else dispatch_lua.decode()
        self.scripts["dispatch"] = self.client.register_script(
            slots.wrap_dispatch(
                clock.DISPATCH_PREFIX + fairness.FETCH_PREFIX + slots.FETCH_PREFIX + dispatch_lua
            )
        )
        self._enqueue_script = self.client.register_script(
            _ONCE_PER_MARKER
            + _INTAKE_ON_ENQUEUE
            + wake
            + fairness.ENQUEUE_PREFIX
            + clock.DISPATCH_PREFIX
            + fairness.FETCH_PREFIX
            + dispatch_lua
        )
        # Built at the first send: it asks Redis for the Lua stack size, and
        # nothing may talk to Redis while Django starts.
        self._packed: PackedEnqueue | None = None

    @property
    def consumer_class(self) -> type[_RedisConsumer]:
        return _WakeupConsumer if self.instant_wakeup else LedgerOrderedConsumer

    def enqueue(
        self,
        message: dramatiq.Message[Any],
        *,
        delay: int | None = None,
        replacing: tuple[str, str] | None = None,
    ) -> dramatiq.Message[Any]:
        """RedisBroker.enqueue, except that the bytes it sends are handed to each
        middleware's ``check_encoded`` (the payload size limit), which would
        otherwise encode the message again. They are encoded once every
        ``before_enqueue`` hook has run, so the check sees the final message.

        ``replacing``: the queue and redis message id of a message this worker
        fetched, acked in the same Redis transaction as the send."""
        queue_name = message.queue_name
        # Unique per enqueue: a retry is the same message id enqueued again.
        options = {"redis_message_id": str(uuid4())}
        concurrency_key = concurrency_keys.send_key(message)
        if concurrency_key is not None:  # for the fetch to take its slot (jobs.concurrency.slots)
            options[slots.SEND_OPTION] = concurrency_key
        message = message.copy(options=options)
        if delay is not None:
            queue_name = dq_name(queue_name)
            # Due on Redis's clock, which every host shares: the worker that
            # holds it until then reads it on its own (jobs.broker.clock).
            eta = clock.redis_now_ms(self.client) + delay
            message = message.copy(queue_name=queue_name, options={"eta": eta})
        self.logger.debug("Enqueueing message %r on queue %r.", message.message_id, queue_name)
        self.emit_before("enqueue", message, delay)
        data = message.encode()
        for middleware in self._handlers("check_encoded"):
            middleware.check_encoded(self, message, data)  # type: ignore[attr-defined]
        intake = any(
            middleware.in_ledger_intake(self, message)  # type: ignore[attr-defined]
            for middleware in self._handlers("in_ledger_intake")
        )
        # A delayed message waits in the delay queue as any does, and takes its
        # key's turn once it moves to the queue (enqueued again, without delay).
        fair_key = fairness.key_of(message) if delay is None else ""
        if fair_key and not fairness.enabled():  # the setting read only for fair actors
            fair_key = ""
        if replacing is not None:
            self._enqueue_replacing(
                queue_name, message.options["redis_message_id"], data, intake, replacing
            )
        else:
            self.do_enqueue(
                queue_name,
                message.options["redis_message_id"],
                data,
                intake=intake,
                fair_key=fair_key,
            )
        self.emit_after("enqueue", message, delay)
        return message

    def do_enqueue(
        self,
        queue_name: str,
        redis_message_id: str,
        data: bytes,
        *,
        intake: bool = False,
        fair_key: str = "",
    ) -> Any:
        """Dramatiq's ``enqueue`` dispatch, the wake-up token and (``intake``) the
        ledger intake entry in one command (with the marker and WAIT of
        ``jobs.broker.replication`` when asked for); with ``fair_key``, into that
        key's list of a fair queue (``jobs.concurrency.fairness``)."""
        ack = replication.current_ack()
        waits = ack is not None and replication.will_wait(self.client, ack)
        extra: tuple[object, ...] = (1,) if intake else ()
        if ack is not None and ack.marker:
            extra = (int(intake), ack.marker, replication.marker_ttl_ms(ack, waits))
        if fair_key:
            # Intake, marker and TTL filled in ("" for none): the key is ARGV[14].
            extra = (*extra, *("",) * (3 - len(extra)), fair_key)
        if not waits:
            try:
                packed = self._packed or self._pack_enqueue()
                command = packed.pack(
                    current_millis(),
                    queue_name,
                    self._should_do_maintenance("enqueue"),
                    redis_message_id,
                    data,
                    extra,
                )
                reply = packed.send(command)
            except (redis.exceptions.NoScriptError, NotSent):
                # Nothing of it ran (the marker is written by the script):
                # sent again below, as the stock broker sends (jobs.broker.packed)
                args = [*self._dispatch_args("enqueue", queue_name, redis_message_id, data)]
                # A plain EVALSHA, as the stock broker sends (redis-py's Script
                # loads the script again when a restarted or promoted server lacks it).
                reply = self._enqueue_script(keys=[self.namespace], args=[*args, *extra])
            if ack is not None:
                replication.check_ack(self.client, ack, False, [reply])
            return reply
        assert ack is not None
        args = [*self._dispatch_args("enqueue", queue_name, redis_message_id, data), *extra]
        try:
            replies = self._enqueue_pipeline(args, ack)
        except redis.exceptions.NoScriptError:
            # Redis restarted (or a failover promoted a replica that never ran the
            # script) and lost its script cache: load it and send again (nothing
            # of the first try ran: the marker is the script's own).
            self.client.script_load(self._enqueue_script.script)
            replies = self._enqueue_pipeline(args, ack)
        replication.check_ack(self.client, ack, True, replies)
        return replies[0]

    def _enqueue_replacing(
        self,
        queue_name: str,
        redis_message_id: str,
        data: bytes,
        intake: bool,
        replacing: tuple[str, str],
    ) -> None:
        """The enqueue and the ack of the message it replaces, in MULTI/EXEC:
        Redis runs both or, if this process dies before EXEC, neither. Scripts go
        by source (EVAL): a missing one would fail alone, and EXEC run the other.
        No replica WAIT and no fair key: a put-back sends to a delay queue."""
        args = self._dispatch_args("enqueue", queue_name, redis_message_id, data)
        pipe = self.client.pipeline(transaction=True)
        script: Any = self._enqueue_script.script
        pipe.eval(script, 1, self.namespace, *args, *((1,) if intake else ()))
        queue_ack(pipe, self.namespace, self.broker_id, *replacing)
        try:
            pipe.execute()
        except UNREACHABLE as exc:
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
        except redis.exceptions.ReadOnlyError as exc:
            # A primary demoted to a replica answers READONLY inside EXEC's
            # reply, where redis-py's Sentinel connection does not turn it into
            # a lost connection (as it does a single command's): drop the pool's
            # idle connections, so the next command asks the Sentinels again.
            # Not those in use: other threads' commands in flight would fail
            # with errors no caller reads as a lost connection.
            self.client.connection_pool.disconnect(inuse_connections=False)
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]

    def _pack_enqueue(self) -> PackedEnqueue:
        self._packed = PackedEnqueue(
            self.client,
            self._enqueue_script.sha,
            self.namespace,
            self.broker_id,
            self.heartbeat_timeout,
            self.dead_message_ttl,
            self._max_unpack_size(),  # type: ignore[no-untyped-call]
        )
        return self._packed

    def _enqueue_pipeline(self, args: list[Any], ack: replication.ReplicaAck) -> list[Any]:
        """The enqueue and the WAIT for replicas, on one connection (WAIT counts
        the replicas holding this connection's writes)."""
        pipe = self.client.pipeline(transaction=False)
        # EVALSHA directly: redis-py's pipelined Script objects cost an extra
        # SCRIPT EXISTS round trip on every execute.
        pipe.evalsha(self._enqueue_script.sha, 1, self.namespace, *args)
        pipe.execute_command("WAIT", ack.replicas, ack.timeout_ms)
        replies: list[Any] = pipe.execute()
        return replies

    def _dispatch_args(self, command: str, queue_name: str, *args: Any) -> list[Any]:
        # The argument layout of dispatch.lua, as RedisBroker._dispatch builds it.
        return [
            command,
            current_millis(),
            queue_name,
            self.broker_id,
            self.heartbeat_timeout,
            self.dead_message_ttl,
            self._should_do_maintenance(command),
            self._max_unpack_size(),  # type: ignore[no-untyped-call]
            *args,
        ]

    def _push_tokens(self, pipe: Any, queue_name: str, count: int) -> None:
        key = wake_key(self.namespace, queue_name)
        pipe.lpush(key, *([1] * min(count, WAKE_LIST_MAX)))
        pipe.ltrim(key, 0, WAKE_LIST_MAX - 1)

    def wake(self, queue_name: str, count: int = 1) -> None:
        """Wake up to ``count`` idle consumers of ``queue_name``."""
        pipe = self.client.pipeline(transaction=False)
        self._push_tokens(pipe, queue_name, count)
        pipe.execute()


class _WakeupConsumer(LedgerOrderedConsumer):
    """Waits on the wake list (BLPOP) where the stock consumer sleeps."""

    broker: WakeupRedisBroker

    def __init__(
        self, broker: WakeupRedisBroker, queue_name: str, prefetch: int, timeout: int
    ) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)
        self.wake_key = wake_key(broker.namespace, queue_name)
        # A BLPOP must return before the client's socket timeout, or redis-py
        # reports a dead connection and the worker restarts its consumer.
        socket_timeout = broker.client.connection_pool.connection_kwargs.get("socket_timeout")
        self.max_wait_ms = int(socket_timeout * 1000 / 2) if socket_timeout else timeout

    def requeue(self, messages: Iterable[dramatiq.MessageProxy]) -> None:
        # A stopping worker hands its prefetched messages back: tell idle peers.
        messages = list(messages)
        super().requeue(messages)
        if messages:
            try:
                self.broker.wake(self.queue_name, len(messages))
            except UNREACHABLE:
                # Handed back already: a lost wake-up only costs a poll.
                logger.warning("Could not wake consumers of %s", self.queue_name)

    def _fill(self) -> bool:
        try:
            room = self.prefetch - self.outstanding_message_count
            book = takes.of(self.broker.broker_id)
            slot_args = concurrency_keys.fetch_args(self.queue_name, book.call)
            taken: list[str] = []
            try:
                reply = self.broker.do_fetch(self.queue_name, room, *slot_args)
                if slot_args:
                    # The slots the fetch took (or the jobs it parked) ride on its reply.
                    taken = self.note_fetched_slots(reply.pop(), int(slot_args[1]))
            finally:
                if slot_args:  # (a reply lost: its takes are this worker's sweep's)
                    book.called(int(slot_args[1]), taken)
            self.message_cache = reply
            if self.message_cache:
                return True
            if slot_args and self.parked_by_fetch:
                return False  # not idle: the jobs it took were parked; fetch again
            # Same bound as the stock sleep, so an idle consumer sends Redis the
            # same few commands a second (heartbeats and maintenance ride on them).
            self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
            wait_ms = max(1, min(backoff_ms, self.max_wait_ms))
            self.broker.client.blpop([self.wake_key], timeout=wait_ms / 1000)
            return False
        except UNREACHABLE as exc:
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
