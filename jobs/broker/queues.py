"""Queue state kept in Redis: depth, delayed, dead letters, pause and cancel marks.

Reads the RedisBroker's own structures (see dramatiq's dispatch.lua):
``<ns>:<queue>`` list of waiting ids, ``<queue>.msgs`` payloads,
``<queue>.DQ.msgs`` delayed payloads, ``<queue>.XQ`` dead-letter sorted set.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

import dramatiq
from dramatiq.errors import DecodeError

from jobs.broker import redis_broker
from jobs.concurrency import fairness
from jobs.concurrency.slots import PARKED_SINCE, report_damage
from jobs.concurrency.slots import PER_QUEUE as PARKED_PER_QUEUE

CONTROL_PREFIX = "jobs:control"
CANCEL_TTL_SECONDS = 8 * 86400  # longer than the broker's 7-day max delay


@dataclass(frozen=True)
class QueueStats:
    name: str
    waiting: int  # in the queue, or parked for a concurrency slot (jobs.concurrency)
    delayed: int
    dead: int
    oldest_waiting_age_s: float | None
    paused: bool
    parked: int = 0  # of ``waiting``: jobs whose concurrency key was full


def _key(*parts: str) -> str:
    return ":".join((CONTROL_PREFIX, *parts))


def queue_names() -> list[str]:
    broker = redis_broker()
    return sorted(q for q in broker.get_declared_queues() if not q.endswith((".DQ", ".XQ")))


def _count(value: Any, what: str) -> int:
    """A count the platform keeps (0 when none, or when damaged: reported)."""
    if not isinstance(value, Exception):
        try:
            return max(0, int(value or 0))
        except ValueError:
            pass
    report_damage(f"{what} holds {value!r}, not a count", "it is read as 0")
    return 0


def _first(value: Any, what: str) -> Any:
    if isinstance(value, Exception):
        report_damage(f"{what} cannot be read ({value})", "its jobs' age is not shown")
        return []
    return value


def queue_stats(queue_name: str) -> QueueStats:
    broker = redis_broker()
    base = f"{broker.namespace}:{queue_name}"
    # One transaction: a fetch between the reads would count its jobs twice or not at all.
    pipe = broker.client.pipeline(transaction=True)
    pipe.llen(base)
    pipe.hlen(f"{base}.DQ.msgs")
    pipe.zcard(f"{base}.XQ")
    pipe.lindex(base, 0)
    pipe.sismember(_key("paused"), queue_name)
    pipe.hget(f"{broker.namespace}:{PARKED_PER_QUEUE}", queue_name)
    # A fair queue's jobs wait in its keys' lists (jobs.concurrency.fairness).
    pipe.hget(fairness.counts_key(broker.namespace, queue_name), "jobs")
    pipe.zrange(fairness.heads_key(broker.namespace, queue_name), 0, 0, withscores=True)
    pipe.zrange(f"{broker.namespace}:{PARKED_SINCE}{queue_name}", 0, 0, withscores=True)
    results = pipe.execute(raise_on_error=False)
    for result in results[:5]:  # (Dramatiq's keys and the pause set: raised as ever)
        if isinstance(result, Exception):
            raise result
    waiting, delayed, dead, oldest_id, paused = results[:5]
    # The platform's own counts and indexes: one written over by hand reads as
    # none, reported, so the console, the metrics and the watchdog go on.
    parked = _count(results[5], f"{broker.namespace}:{PARKED_PER_QUEUE} {queue_name!r}")
    waiting += _count(results[6], fairness.counts_key(broker.namespace, queue_name))
    first_fair = _first(results[7], fairness.heads_key(broker.namespace, queue_name))
    first_parked = _first(results[8], f"{broker.namespace}:{PARKED_SINCE}{queue_name}")
    age = None
    if oldest_id is not None:
        raw = broker.client.hget(f"{base}.msgs", oldest_id)
        if raw is not None:
            message = dramatiq.Message.decode(cast(bytes, raw))
            age = max(0.0, time.time() - message.message_timestamp / 1000)
    # The oldest job of a fair key (since it was enqueued there), and a job
    # waiting for a concurrency slot (since it was parked, on Redis's clock): a
    # starved key, or one whose slots never free, shows as an old queue.
    for first in (first_fair, first_parked):
        if first:
            other = max(0.0, time.time() - first[0][1] / 1000)
            age = other if age is None else max(age, other)
    return QueueStats(queue_name, waiting + parked, delayed, dead, age, bool(paused), parked)


def all_queue_stats() -> list[QueueStats]:
    return [queue_stats(name) for name in queue_names()]


def pause(queue_name: str) -> bool:
    """Pause a queue; False if it was paused already."""
    return bool(redis_broker().client.sadd(_key("paused"), queue_name))


def resume(queue_name: str) -> bool:
    """Resume a queue; False if it was not paused."""
    return bool(redis_broker().client.srem(_key("paused"), queue_name))


def cancel(message_ids: list[str]) -> None:
    """Mark messages so a worker skips them instead of running them."""
    if not message_ids:
        return
    now = time.time()
    pipe = redis_broker().client.pipeline(transaction=False)
    pipe.zadd(_key("cancelled"), {message_id: now for message_id in message_ids})
    pipe.zremrangebyscore(_key("cancelled"), "-inf", now - CANCEL_TTL_SECONDS)
    pipe.execute()


def cancelled_among(message_ids: list[str]) -> set[str]:
    """Which of ``message_ids`` an operator cancelled: one round trip, O(ids)."""
    if not message_ids:
        return set()
    pipe = redis_broker().client.pipeline(transaction=False)
    for message_id in message_ids:
        pipe.zscore(_key("cancelled"), message_id)
    horizon = time.time() - CANCEL_TTL_SECONDS
    return {
        message_id
        for message_id, score in zip(message_ids, pipe.execute(), strict=True)
        if score is not None and score >= horizon
    }


@dataclass(frozen=True)
class Controls:
    paused: frozenset[str]
    cancelled: frozenset[str]


def controls() -> Controls:
    """Paused queues and cancelled message ids: one round trip for a whole process.

    Workers read this at most once per ``JOBS_CONTROL_REFRESH_MS`` (not per job),
    so pausing or cancelling takes effect within that time.
    """
    pipe = redis_broker().client.pipeline(transaction=False)
    pipe.smembers(_key("paused"))
    pipe.zrangebyscore(_key("cancelled"), time.time() - CANCEL_TTL_SECONDS, "+inf")
    paused, cancelled = pipe.execute()
    return Controls(frozenset(q.decode() for q in paused), frozenset(m.decode() for m in cancelled))


def locate(queue_name: str, redis_message_id: str) -> str:
    """Where a delivered message is now: "pending" (waiting, delayed or in a
    worker's hands), "dead" (dead-lettered) or "gone" (acked: it finished)."""
    broker = redis_broker()
    base = f"{broker.namespace}:{queue_name}"
    pipe = broker.client.pipeline(transaction=False)
    for name in (f"{base}.msgs", f"{base}.DQ.msgs", f"{base}.XQ.msgs"):
        pipe.hexists(name, redis_message_id)
    waiting, delayed, dead = pipe.execute()
    if waiting or delayed:
        return "pending"
    return "dead" if dead else "gone"


# A message moves between a queue and its delay queue by being written to one
# before it is deleted from the other (dramatiq's delay consumer when it comes
# due, Control's put-back while its queue is paused), so at every instant it is
# in one of the two. Reading one and then the other can still miss it: it left
# the second for the first in between. Alternating passes close that: one that
# moved n times while we read is found within n + 2 passes, so four passes find
# a message that moved twice (a paused message's round trip, which takes a
# pause recheck interval).
_PASSES = (("delayed", "DQ.msgs"), ("waiting", "msgs"), ("delayed", "DQ.msgs"), ("waiting", "msgs"))


def find(queue_name: str, message_ids: set[str]) -> dict[str, tuple[str, str]]:
    """Where the messages ``message_ids`` wait, whatever their Redis ids now:
    message id -> ("waiting" or "delayed", redis message id).

    A message moved from the delay queue to its queue, or put back while its
    queue is paused, has a new Redis id the ledger may not know yet. Redis
    indexes payloads by that id only, so this reads the payloads of the queue
    and of its delay queue, in alternating passes (``_PASSES``) that stop once
    every id asked for was seen.
    """
    broker = redis_broker()
    found: dict[str, tuple[str, str]] = {}
    for place, suffix in _PASSES:
        if len(found) == len(message_ids):
            break
        name = f"{broker.namespace}:{queue_name}.{suffix}"
        for redis_id, raw in broker.client.hscan_iter(name, count=1000):
            try:
                message_id = dramatiq.Message.decode(cast(bytes, raw)).message_id
            except DecodeError:
                continue  # not a message: no worker would run it either
            if message_id in message_ids:
                found[message_id] = (place, cast(bytes, redis_id).decode())
    return found


def dead_letter(queue_name: str, redis_message_id: str) -> dramatiq.Message[Any] | None:
    """The full dead-lettered message (unredacted arguments), while Redis keeps it."""
    broker = redis_broker()
    raw = broker.client.hget(f"{broker.namespace}:{queue_name}.XQ.msgs", redis_message_id)
    return None if raw is None else dramatiq.Message.decode(cast(bytes, raw))


def drop_dead_letter(queue_name: str, redis_message_id: str) -> None:
    broker = redis_broker()
    pipe = broker.client.pipeline()
    pipe.zrem(f"{broker.namespace}:{queue_name}.XQ", redis_message_id)
    pipe.hdel(f"{broker.namespace}:{queue_name}.XQ.msgs", redis_message_id)
    pipe.execute()


def force_maintenance() -> None:
    """Run the broker's maintenance now on every queue.

    Dramatiq's Redis broker puts a dead worker's unacked messages back only
    during maintenance, which it runs on ~0.1% of commands; at low traffic that
    can take many minutes. The watchdog calls this to reconcile at once.
    """
    broker = redis_broker()
    dispatch = broker.scripts["dispatch"]
    for queue_name in queue_names():
        for name in (queue_name, f"{queue_name}.DQ"):
            dispatch(
                args=[
                    "qsize",
                    int(time.time() * 1000),
                    name,
                    broker.broker_id,
                    broker.heartbeat_timeout,
                    broker.dead_message_ttl,
                    1,
                    broker._max_unpack_size(),  # type: ignore[no-untyped-call]
                ],
                keys=[broker.namespace],
            )
