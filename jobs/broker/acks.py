"""Acks that wait for the job ledger without making a worker thread wait.

A job's end must be in the database before its message is acked: once acked,
nothing in Redis says the job ran, so a success lost with a killed worker's
unwritten batch could only be guessed. Waiting for that write in the worker
thread (as ``ledger.record(durable=True)`` does) keeps the order but leaves the
thread idle for a transaction per job: with fast jobs, most of a worker's time.

Here the worker thread hands the ack over instead: the consumer asks the ledger
writer to call back once the job's events are written, and the writer sends the
acks of everything its transaction covered in one pipelined round trip. The
thread takes its next message at once; the message stays in this worker's ack
set (and counts against its prefetch) until the ack is sent, so a worker killed
in between has the message redelivered, as with any unacked message.

A message whose retry could not be enqueued (Redis unreachable: a failover
under way) is marked ``GIVE_BACK`` by the Retries middleware; its ack becomes a
requeue, held and retried like any ack, so the promoted primary runs it again
instead of dropping it (``jobs.middleware.retries``).

The consumer also hands back, when it closes, the messages it fetched into its
ack set but never passed to a worker thread (Dramatiq's own consumer leaves
them there; see ``LedgerOrderedConsumer.close``).
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import dramatiq
import redis
from dramatiq.brokers.redis import _RedisConsumer
from dramatiq.common import compute_backoff, current_millis
from dramatiq.errors import ConnectionClosed, DecodeError

from jobs.broker import clock, room, strays, unknown_actors
from jobs.broker.proxies import with_fields
from jobs.broker.scripts import LuaScript
from jobs.concurrency import keys as concurrency_keys
from jobs.concurrency import slots, takes
from jobs.ledger import writer as ledger
from jobs.observability import metrics

if TYPE_CHECKING:
    from jobs.broker.wakeup import WakeupRedisBroker

logger = logging.getLogger(__name__)

# One warning per interval while Redis refuses the acks (they are retried on
# every pass of the ledger writer, ~5 a second).
_WARN_EVERY = 10.0

# The message option that turns a message's ack into a requeue: it ran, failed,
# and its retry never reached Redis, so the message itself must go back. Its
# value is a token naming this one give-back (``give_back_token``).
GIVE_BACK = "give_back"
# How long a give-back's token outlives it: longer than any wait for Redis.
GIVE_BACK_MARK_MS = 24 * 3600 * 1000

# dispatch.lua's requeue, made safe to send again. A give-back is a held ack,
# sent again whenever its reply is lost; by then this worker may have fetched
# the message back (it is in the ack set again, running), and a plain requeue
# would push it onto its queue a second time. The token is set with the
# requeue, in the same script: a second sending finds it and does nothing.
# KEYS: namespace, token key. ARGV: queue name, broker id, redis message id.
_GIVE_BACK = LuaScript("""
if not redis.call("set", KEYS[2], 1, "NX", "PX", ARGV[4]) then
  return 0
end
local queue = KEYS[1] .. ":" .. ARGV[1]
if redis.call("srem", KEYS[1] .. ":__acks__." .. ARGV[2] .. "." .. ARGV[1], ARGV[3]) > 0 then
  if redis.call("hexists", queue .. ".msgs", ARGV[3]) == 1 then
    redis.call("rpush", queue, ARGV[3])
  end
end
return 1
""")


# Dramatiq's dispatch.lua "ack" for every message of one queue that a batch
# acks, in one command: the heartbeat, then per message the SREM from this
# worker's ack set and, only when it was there, the HDEL of its payload (a
# message that maintenance already handed back stays queued). One EVALSHA per
# message cost the writer thread ~13 arguments to pack and a script call each.
# KEYS: namespace. ARGV: timestamp, broker id, queue name, redis message ids.
_ACK_MANY = LuaScript(
    clock.FIRST_ARG_PREFIX
    + """
local acks = KEYS[1] .. ":__acks__." .. ARGV[2] .. "." .. ARGV[3]
local messages = KEYS[1] .. ":" .. ARGV[3] .. ".msgs"
redis.call("zadd", KEYS[1] .. ":__heartbeats__", ARGV[1], ARGV[2])
for i = 4, #ARGV do
  if redis.call("srem", acks, ARGV[i]) > 0 then
    redis.call("hdel", messages, ARGV[i])
  end
end
return 1
"""
)
# Messages per _ACK_MANY call: a script blocks Redis while it runs.
ACKS_PER_CALL = 500


def queue_ack(pipe: Any, namespace: str, broker_id: str, queue_name: str, redis_id: str) -> None:
    """Add to ``pipe`` the ack of one message fetched from ``queue_name``, by its
    script's source: inside MULTI a missing script fails alone and EXEC runs the
    rest (``jobs.broker.unknown_actors`` sends a copy and this ack as one)."""
    pipe.eval(_ACK_MANY.source, 1, namespace, current_millis(), broker_id, queue_name, redis_id)


def give_back_token() -> str:
    """The value of ``GIVE_BACK`` for one give-back of a message."""
    return secrets.token_hex(8)


def _held_until_eta(message: dramatiq.MessageProxy) -> bool:
    """Whether Dramatiq's worker will hold ``message`` until its ``eta`` (a
    sender that set one itself, on a queue other than a delay queue) and then
    send a copy without it: this delivery never runs, its copy takes a slot."""
    return "eta" in getattr(message, "_message", message).options


def _give_back_keys(namespace: str, message: dramatiq.MessageProxy) -> list[str]:
    return [namespace, f"{namespace}:__given_back__.{message.options[GIVE_BACK]}"]


def _give_back_args(broker: Any, queue_name: str, message: dramatiq.MessageProxy) -> list[Any]:
    redis_id = message.options["redis_message_id"]
    return [queue_name, broker.broker_id, redis_id, GIVE_BACK_MARK_MS]


# (consumer, message, "ack", "nack" or "requeue")
HeldAck = tuple["LedgerOrderedConsumer", dramatiq.MessageProxy, str]

# What an unreachable Redis raises: refused or dropped (ConnectionError), or
# hung past the socket timeout (TimeoutError, which is not a ConnectionError).
# The consumer turns both into Dramatiq's ConnectionClosed: any other exception
# takes Dramatiq's generic branch, whose close() lets it end the consumer thread.
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)
# Redis answering but taking no writes for now: a replica (a failover seen
# through a plain URL; Sentinel's clients turn it into a lost connection), or
# full (maxmemory with noeviction). An ack, a nack or a give-back it refuses is
# sent again, as for an unreachable Redis: dropped, its job stayed in this
# worker's ack set, to run a second time once the worker stopped.
REFUSING_WRITES = (redis.ReadOnlyError, redis.exceptions.OutOfMemoryError)


# Messages whose held ack the consumer does not count against its prefetch. The
# prefetch bounds what a worker has taken and not yet run; a finished job waiting
# for its batch is not that, and counting it would cap a batch at the prefetch
# (small transactions, a slower writer). Past this many, a stalled ledger (the
# database down) stops the worker from taking more work.
HELD_ACKS_MAX = 1000


class LedgerOrderedConsumer(_RedisConsumer):
    """Dramatiq's Redis consumer whose ack/nack follows the job's ledger write
    and that hands back, when closed, what it fetched and never passed on."""

    broker: WakeupRedisBroker

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]
        self.held_ids: set[str] = set()  # handed to the ledger writer, not yet acked
        # Kept by the consumer thread across the consumers it makes (jobs.broker.strays).
        self.memory = strays.memory_of(threading.current_thread())
        self._delays = self.queue_name.endswith(".DQ")
        self._strays_handed_back = False
        # Woken by the ack that makes room rather than sleeping (jobs.broker.room).
        self.room = room.Room()
        self.work_queue = room.work_queue_of(threading.current_thread())
        # Slots taken for jobs still in the fetch cache (``_slot_taken``).
        self.slots_taken: dict[str, slots.Decided] = {}
        # Jobs an ACQUIRE whose reply was lost asked for: message id -> its take
        # token (their slots, if it took them, are freed under it).
        self.maybe_taken: dict[str, int] = {}
        self.parked_by_fetch = 0  # jobs the last fetch parked (``note_fetched_slots``)

    def __next__(self) -> dramatiq.MessageProxy | None:
        if not self._strays_handed_back:
            self._hand_back_strays()
            self._strays_handed_back = True
        message = self._next()
        if message is None:
            return None
        with_fields(message)
        if not self._delays and unknown_actors.is_unknown(self.broker, message):
            self._unknown_actor(message)
            return None
        if not self._delays and not self._slot_taken(message):
            return None
        if self._delays:
            self.memory.delayed[message.message_id] = message.options["redis_message_id"]
            # Due on Redis's clock (jobs.broker.clock); Dramatiq's worker holds
            # it until this host's clock reaches its eta. Only this copy changes:
            # the one in Redis keeps Redis's time for whoever fetches it next.
            eta = message.options.get("eta")
            if isinstance(eta, int):
                message.options["eta"] = clock.to_local_ms(self.broker.client, eta)
        return message

    def _unknown_actor(self, message: dramatiq.MessageProxy) -> None:
        """Put back (or, after waiting too long, dead-letter with a ledger row) a
        message no worker thread here could run (``jobs.broker.unknown_actors``)."""
        try:
            if unknown_actors.put_back(self.broker, message, self.queue_name):
                # The copy and this message's ack went in one Redis transaction.
                self.queued_message_ids.discard(message.message_id)
                self.made_room()
                return
            ledger.record(unknown_actors.failure_event(message), durable=True)
            message.fail()
            self.nack(message)
        except (ConnectionClosed, redis.RedisError) as exc:
            # Nothing acked (or, if the reply was lost, all of it): this thread's
            # next consumer hands the message back (jobs.broker.strays; a no-op
            # for one acked). Left alone it waited in this live worker's ack set
            # until the process stopped. Any refusal, not only a lost Redis: a
            # full one (OOM), a read-only replica.
            self.memory.left.add(message.options["redis_message_id"])
            if isinstance(exc, ConnectionClosed):
                raise
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]

    def _slot_taken(self, message: dramatiq.MessageProxy) -> bool:
        """Whether a job may go on to a worker thread: always, unless its actor
        declares a concurrency key (``jobs.concurrency``) whose slots are all
        taken. Then the job is parked in Redis, out of this worker's ack set,
        and started when a slot frees. The slots of every keyed job in the
        fetched batch are asked for at once."""
        decided = self._decision_for(message)
        if decided is not None:
            if _held_until_eta(message):
                self._free(self._slot_of(message, decided))  # (kept decisions: taken)
                return True
            outcome = slots.Outcome(decided.outcome, decided.waited, decided.reason)
            key, token = decided.key, decided.token
        else:
            keyed = concurrency_keys.key_of(message)
            if keyed is None:
                return True
            if _held_until_eta(message):
                return True
            key = keyed[0]
            try:
                outcome, token = self._acquire_batch(message, keyed)
            except redis.RedisError as exc:  # not only UNREACHABLE: a read-only replica, OOM
                # Still in this worker's ack set: back to the cache, handed back by
                # close() (or, with Redis away, by this thread's next consumer).
                self.message_cache.insert(0, message.encode())
                self.queued_message_ids.discard(message.message_id)
                raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
        taken, waited, reason = outcome
        if taken == slots.UNUSABLE:
            # Its key's data in Redis is of another type: no slot can be taken
            # or parked on. On to a worker thread, where the Concurrency
            # middleware fails it for good, before it runs: recorded in the
            # ledger and dead-lettered, for the admin's Retry once repaired.
            concurrency_keys.refuse(message, key, reason)
            return True
        if taken == slots.TAKEN:
            # Its release reads the key here rather than building it again.
            concurrency_keys.remember_key(message, key, token)
            if waited is not None:
                metrics.SLOT_WAIT.labels(message.actor_name, self.queue_name).observe(waited)
            return True
        self.queued_message_ids.discard(message.message_id)
        if taken == slots.PARKED_NOW and key is not None:
            self._parked(key, message.actor_name)
        return False

    def _decision_for(self, message: dramatiq.MessageProxy) -> slots.Decided | None:
        """The fetch's (or an ACQUIRE's) decision on ``message``'s slot, no
        longer kept; None if none was made for this copy of the message."""
        decided = self.slots_taken.pop(message.message_id, None)
        if decided is not None and decided.by_fetch and not concurrency_keys.sent_key(message):
            # Another copy of the message (sent without its key, by an older
            # sender): the fetch's decision is its twin's, which comes later.
            self.slots_taken[message.message_id] = decided
            return None
        return decided

    def _parked(self, key: str, actor_name: str) -> None:
        """A job set aside for a slot of ``key``: counted, and the key noted as
        waited for (its releases go at once, ``jobs.middleware.concurrency``)."""
        slots.note_waited(key)
        metrics.PARKED.labels(actor_name, self.queue_name).inc()

    def note_fetched_slots(self, info: list[Any], token: int) -> list[str]:
        """What the fetch of take token ``token``, which took slots itself,
        decided (``slots.decided``): the taken ones pass ``_slot_taken`` without
        a round trip; the parked ones never reach this worker. The message ids
        of the taken ones."""
        self.parked_by_fetch = 0
        taken = []
        for job in slots.decided(info, token):
            if job.outcome == slots.TAKEN:
                self.slots_taken[job.message_id] = job
                taken.append(job.message_id)
            elif job.outcome == slots.UNUSABLE:
                self._unusable(job)
            else:
                self.parked_by_fetch += 1
                self._parked(job.key, job.actor_name)
        return taken

    def _unusable(self, job: slots.Decided) -> None:
        """Note a job whose key could not be used, to fail for good when it
        comes out of the cache; never over another decision on the same
        message id: a twin copy of it, fetched before, took a slot (the
        decisions are kept per message id), and that copy runs, while this
        one gets its own decision from the consumer's ACQUIRE."""
        self.slots_taken.setdefault(job.message_id, job)

    def _acquire_batch(
        self, message: dramatiq.MessageProxy, keyed: tuple[str, int]
    ) -> tuple[slots.Outcome, int]:
        """Slots for ``message`` and every keyed job still in the fetch cache, in
        one round trip; the cached jobs that were parked leave the cache.
        ``message``'s outcome, and the take token."""
        wanted = [
            slots.Wanted(
                keyed[0],
                keyed[1],
                message.message_id,
                message.options["redis_message_id"],
                message.actor_name,
                concurrency_keys.template_of(message.actor_name),
            )
        ]
        cached: list[bytes | None] = []
        for data in self.message_cache:
            try:
                other = dramatiq.Message.decode(data)
            except DecodeError:
                continue  # Dramatiq's own __next__ reports it when it gets there
            other_keyed = concurrency_keys.key_of(other)
            if other_keyed is not None and other.message_id not in self.slots_taken:
                wanted.append(
                    slots.Wanted(
                        *other_keyed,
                        other.message_id,
                        other.options["redis_message_id"],
                        other.actor_name,
                        concurrency_keys.template_of(other.actor_name),
                    )
                )
                cached.append(data)
        token = takes.of(self.broker.broker_id).call()
        try:
            outcomes = slots.acquire(
                self.broker.client,
                self.broker.namespace,
                wanted,
                broker_id=self.broker.broker_id,
                queue_name=self.queue_name,
                timeout_ms=int(self.broker.heartbeat_timeout),
                token=token,
            )
        except redis.RedisError:
            # Redis may have taken their slots and the reply been lost: when
            # they are handed back, their release names this take.
            self.maybe_taken.update((job.message_id, token) for job in wanted)
            raise
        parked = set()
        for job, data, outcome in zip(wanted[1:], cached, outcomes[1:], strict=True):
            if outcome.outcome in (slots.TAKEN, slots.UNUSABLE):  # (both stay in the cache)
                decided = slots.Decided(
                    job.message_id,
                    outcome.outcome,
                    outcome.waited,
                    job.key,
                    job.actor_name,
                    token,
                    by_fetch=False,
                    reason=outcome.reason,
                )
                if outcome.outcome == slots.TAKEN:
                    self.slots_taken[job.message_id] = decided
                else:
                    self._unusable(decided)
            else:
                parked.add(id(data))
                if outcome[0] == slots.PARKED_NOW:
                    self._parked(job.key, job.actor_name)
        if parked:
            self.message_cache = [data for data in self.message_cache if id(data) not in parked]
        if outcomes[0][0] != slots.TAKEN:
            logger.debug("Job %s waits for a slot of %r", message.message_id, keyed[0])
        return outcomes[0], token

    def _next(self) -> dramatiq.MessageProxy | None:
        """The next message, or None after a wait: Dramatiq's fetch and sleep,
        except that a full consumer is woken when a worker thread makes room."""
        # While messages are cached (always, under load) every consumer class
        # takes the same path: Dramatiq's, straight to its cache.
        if not self.message_cache:
            if not self.has_room():
                self.wait_for_room()
                return None
            if not self._fill():
                return None
        try:
            message: dramatiq.MessageProxy | None = super().__next__()  # type: ignore[no-untyped-call]
        except redis.TimeoutError as exc:
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
        return message

    def _fill(self) -> bool:
        """Before a fetch with room: False after waiting for messages instead.
        Here Dramatiq's ``__next__`` fetches, and sleeps when none came; the
        wake-up consumer fetches itself and waits on its wake list."""
        return True

    def _hand_back_strays(self) -> None:
        """What this thread's earlier consumer took and lost (``jobs.broker.strays``)."""
        redis_ids, settled = self.memory.lost(threading.current_thread())
        if not redis_ids:
            return
        try:
            self.broker.do_requeue(self.queue_name, *redis_ids)
            if self.broker.instant_wakeup:
                self.broker.wake(self.queue_name, len(redis_ids))
        except UNREACHABLE as exc:
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
        self.memory.handed_back(settled)
        logger.warning(
            "Handed back %d message(s) of %s that this worker took and lost from memory "
            "while Redis was unreachable",
            len(redis_ids),
            self.queue_name,
        )

    def requeue(self, messages: Iterable[dramatiq.MessageProxy]) -> None:
        messages = list(messages)
        try:
            super().requeue(messages)  # type: ignore[no-untyped-call]
        except UNREACHABLE as exc:
            # (Dramatiq's ConsumerThread.close and Worker.stop expect this one;
            # delayed messages stay remembered for the thread's next consumer.)
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
        for message in messages:  # handed back: no longer this thread's to keep
            self._settled(message)
        if not self._delays:
            self._free_slots(messages)

    def _free_slots(self, messages: list[dramatiq.MessageProxy]) -> None:
        """Slots of handed-back jobs (taken when passed on, or with their fetch,
        never run): freed for the next parked job. The handed-back job takes one
        again when fetched."""
        self._free(self._slots_of(messages))

    def _slots_of(self, messages: list[dramatiq.MessageProxy]) -> list[slots.Held]:
        """The slots ``messages`` hold or may hold: under the take that passed
        each on (noted on it), that took it with the fetch (one still cached),
        or an ACQUIRE whose reply was lost. A job no take asked for has none."""
        held = []
        for message in messages:
            decided = self._decision_for(message)
            maybe = self.maybe_taken.pop(message.message_id, None)
            if decided is not None:
                held += self._slot_of(message, decided)
            elif (slot := concurrency_keys.held_slot(message, maybe)) is not None:
                held.append(slot)
        return held

    @staticmethod
    def _slot_of(message: dramatiq.MessageProxy, decided: slots.Decided) -> list[slots.Held]:
        """The slot the take that ``decided`` on ``message`` holds: none for a
        key it could not use (it wrote nothing)."""
        if decided.outcome == slots.UNUSABLE:
            return []
        slot = concurrency_keys.held_slot(message, decided.token)
        return [slot] if slot is not None else []

    def _free(self, held: list[slots.Held]) -> None:
        if not held:
            return
        try:
            slots.release(
                self.broker.client, self.broker.namespace, held, broker_id=self.broker.broker_id
            )
        except redis.RedisError:  # the jobs are handed back already: never raise here
            self._free_later(held)

    def _free_later(self, held: list[slots.Held]) -> None:
        """Slots of jobs that will not run here, freed once Redis answers (by
        the job-slots thread, ``jobs.middleware.concurrency``). Their holder is
        this live worker: left alone, they stayed taken until it stopped."""
        if not held:
            return
        for middleware in self.broker.middleware:
            release_later = getattr(middleware, "release_later", None)
            if release_later is not None and release_later(held):
                return
        # No job-slots thread (a stopping worker): the verdict on this worker
        # frees them once it stops beating.
        logger.warning("Slots of %d handed-back job(s) not freed", len(held))

    def _settled(self, message: dramatiq.MessageProxy) -> None:
        if self._delays:
            self.memory.delayed.pop(message.message_id, None)

    @property
    def outstanding_message_count(self) -> int:
        waiting = len(self.queued_message_ids) - min(len(self.held_ids), HELD_ACKS_MAX)
        return waiting + len(self.message_cache)

    def has_room(self) -> bool:
        """Dramatiq's rule: fetch while fewer than ``prefetch`` messages are held."""
        return self.outstanding_message_count < int(self.prefetch)

    def wait_for_room(self) -> None:
        """Dramatiq's sleep of a full consumer, cut short by an ack that leaves
        enough room (``jobs.broker.room``)."""
        self.misses, backoff_ms = compute_backoff(self.misses, max_backoff=self.timeout)
        self.room.wait(self._worth_waking, backoff_ms / 1000)

    def _worth_waking(self) -> bool:
        if self._delays:  # acked by the consumer thread itself, never while it waits
            return self.has_room()
        return room.worth_waking(self.outstanding_message_count, self.prefetch, self.work_queue)

    def made_room(self) -> None:
        """After an ack or nack: wake the consumer thread if it waits for room."""
        if self.room.awaited:
            self.room.made(self._worth_waking)

    def ack(self, message: dramatiq.MessageProxy) -> None:
        try:
            self._ack(message)
        finally:
            self.made_room()

    def _ack(self, message: dramatiq.MessageProxy) -> None:
        self._settled(message)
        command = "requeue" if message.options.get(GIVE_BACK) else "ack"
        if self._held(message, command):
            return
        if command == "ack":
            try:
                super().ack(message)  # type: ignore[no-untyped-call]
            except REFUSING_WRITES as exc:
                # (Dramatiq's post_process_message sends it again until it goes.)
                raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
            return
        # (On a connection error, ConnectionClosed: Dramatiq's
        # post_process_message tries again until Redis answers.)
        try:
            _GIVE_BACK(
                self.broker.client,
                _give_back_keys(self.broker.namespace, message),
                _give_back_args(self.broker, self.queue_name, message),
            )
        except (*UNREACHABLE, *REFUSING_WRITES) as exc:
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
        if self.broker.instant_wakeup:
            with contextlib.suppress(redis.RedisError):
                self.broker.wake(self.queue_name)
        self.queued_message_ids.discard(message.message_id)

    def nack(self, message: dramatiq.MessageProxy) -> None:
        self._settled(message)
        try:
            if not self._held(message, "nack"):
                super().nack(message)  # type: ignore[no-untyped-call]
        except REFUSING_WRITES as exc:
            raise ConnectionClosed(exc) from None  # type: ignore[no-untyped-call]
        finally:
            self.made_room()

    def close(self) -> None:
        # A fetch moves up to `prefetch` messages into this worker's ack set and
        # into `message_cache`; the consumer thread passes them on one per loop
        # and leaves the loop as soon as its worker stops. Worker.stop hands back
        # what reached the work queue but not what is still cached, and Dramatiq
        # drops the cache with the consumer. Those messages then wait for
        # maintenance to find this broker id dead: heartbeat_timeout after the
        # process exits, never while its heartbeat goes on (an in-process Worker,
        # a consumer thread restarted after an error). Hand them back now.
        cached, self.message_cache = self.message_cache, []
        fetched = []
        for data in cached:
            # An undecodable one (or None: its payload gone) has no id to hand
            # back; raising here would end the consumer thread.
            with contextlib.suppress(DecodeError):
                fetched.append(dramatiq.MessageProxy(dramatiq.Message.decode(data)))
        try:
            # (The wake-up consumer's requeue also wakes idle peers.)
            self.requeue(fetched)
        except ConnectionClosed:
            # Redis is away: this thread's next consumer hands them back, and
            # their slots (and any the next paragraph frees) go once it answers.
            self.memory.left.update(m.options["redis_message_id"] for m in fetched)
            self._free_later(self._slots_of(fetched) + self._undecoded_slots())
            raise
        self._free(self._undecoded_slots())

    def _undecoded_slots(self) -> list[slots.Held]:
        """Slots the fetch took for jobs that never came out of this consumer:
        payloads Redis's cjson read and Python's decoder refused (Dramatiq's
        ``__next__`` raised, which closes the consumer). Nobody here will run
        them; their slots would otherwise stay taken by a live worker."""
        left, self.slots_taken = self.slots_taken, {}
        held = [
            slots.Held(
                job.key,
                job.message_id,
                concurrency_keys.limit_of(job.actor_name, job.key),
                "",
                job.token,
            )
            for job in left.values()
            if job.outcome != slots.UNUSABLE
        ]
        if held:
            logger.warning("Freeing %d slot(s) of job(s) this worker will not run", len(held))
        return held

    def _held(self, message: dramatiq.MessageProxy, command: str) -> bool:
        held: HeldAck = (self, message, command)
        self.held_ids.add(message.message_id)
        if ledger.after_written(message, self.broker.send_held_acks, held):
            return True
        self.held_ids.discard(message.message_id)
        return False


class HeldAcks:
    """The broker's side: send a batch of held acks in one round trip."""

    namespace: str
    broker_id: str
    client: Any  # redis.Redis, or the Sentinel master client
    scripts: dict[str, Any]
    middleware: list[Any]
    # dispatch.lua's argument list, built by the broker (WakeupRedisBroker)
    _dispatch_args: Callable[..., list[Any]]
    _last_warning = 0.0

    def send_held_acks(self, held: list[HeldAck]) -> list[HeldAck]:
        """Ack (or nack) each message; the ones Redis could not take are returned."""
        try:
            try:
                self._dispatch_all(held)
            except redis.exceptions.NoScriptError:
                # A restarted (or newly promoted) Redis lost its script cache. An
                # ack, a nack or a give-back sent twice changes nothing the second time.
                self.client.script_load(self.scripts["dispatch"].script)
                self.client.script_load(_GIVE_BACK.source)
                self.client.script_load(_ACK_MANY.source)
                self.client.script_load(slots.RELEASE.source)
                self._dispatch_all(held)
        except (*UNREACHABLE, *REFUSING_WRITES) as exc:
            # (Returned, they go again with the writer's next batch: a
            # warning every _WARN_EVERY rather than a traceback each time.)
            now = time.monotonic()
            if now - HeldAcks._last_warning > _WARN_EVERY:
                HeldAcks._last_warning = now
                logger.warning("Could not ack %d job(s), trying again: %s", len(held), exc)
            return held
        consumers = set()
        for consumer, message, _command in held:
            consumer.queued_message_ids.discard(message.message_id)
            consumer.held_ids.discard(message.message_id)
            consumers.add(consumer)
        for consumer in consumers:  # room, if past HELD_ACKS_MAX they counted
            consumer.made_room()
        return []

    def _dispatch_all(self, held: list[HeldAck]) -> None:
        pipe = self.client.pipeline(transaction=False)
        # The consumer's queue, not the message's: a delayed message is acked
        # on the delay queue it came from (as _RedisConsumer.ack does).
        acked: dict[str, list[str]] = {}
        for consumer, message, command in held:
            if command == "ack":
                acked.setdefault(consumer.queue_name, []).append(
                    message.options["redis_message_id"]
                )
            elif command == "requeue":
                keys = _give_back_keys(self.namespace, message)
                args = _give_back_args(self, consumer.queue_name, message)
                pipe.evalsha(_GIVE_BACK.sha, len(keys), *keys, *args)
            else:  # a nack: dispatch.lua's, one each (they are rare)
                args = self._dispatch_args(
                    command, consumer.queue_name, message.options["redis_message_id"]
                )
                pipe.evalsha(self.scripts["dispatch"].sha, 1, self.namespace, *args)
        now = current_millis()
        for queue_name, redis_ids in acked.items():
            for start in range(0, len(redis_ids), ACKS_PER_CALL):
                ids = redis_ids[start : start + ACKS_PER_CALL]
                pipe.evalsha(
                    _ACK_MANY.sha, 1, self.namespace, now, self.broker_id, queue_name, *ids
                )
        # Slots of finished jobs ride along (``Concurrency.ride_along``): one
        # round trip fewer for the job-slots thread.
        carrier = self._release_carrier()
        riders = carrier.ride_along() if carrier is not None else []
        if riders:
            args = slots.release_args(riders, broker_id=self.broker_id)
            pipe.evalsha(slots.RELEASE.sha, 1, self.namespace, *args)
        try:
            # Each command's error in its place: a release Redis refused goes
            # back to the job-slots thread; one it ran is not sent again (a
            # second sending would free the slot its release just reserved for
            # another copy of the same message). A reply lost with the
            # connection is sent again, as the thread's own calls are.
            replies = pipe.execute(raise_on_error=False)
        except BaseException:
            if riders:
                carrier.ride_back(riders, self)
            raise
        if riders:
            reply = replies.pop()
            if isinstance(reply, Exception):
                carrier.ride_back(riders, self)
            else:
                slots.released(reply, riders, broker_id=self.broker_id)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply

    def _release_carrier(self) -> Any:
        """The middleware whose pending slot releases ride with the acks
        (``jobs.middleware.concurrency``), or None."""
        for middleware in self.middleware:
            if hasattr(middleware, "ride_along"):
                return middleware
        return None
