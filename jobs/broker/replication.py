"""Knowing that an enqueued message is on a replica, not only on the primary.

Redis replicates asynchronously: a primary that dies right after taking a
message may not have passed it on, and Sentinel then promotes a replica
without it. ``WAIT n timeout`` after the enqueue, on the same connection,
answers how many replicas hold everything that connection wrote.

A caller that must not lose a message (the outbox) enqueues inside
``confirmed_by_replicas(..., marker=key)``. The broker then writes ``key`` in
the enqueue's own round trip, right after the message. Replication keeps the
primary's write order, so any server holding the marker holds the message:
``confirm_held`` asks the current primary for the marker, and never sends again
a message that is still there (or was there, and already ran). A failover to a
replica without it drops the marker with it, and the caller sends it again.

WAIT costs a replica's round trip (a fraction of a millisecond on a LAN) while a
replica keeps up, but its whole timeout when none does. ``ReplicaGauge`` keeps
that timeout out of requests: it asks ``INFO replication`` at most once a
second, and does not wait while fewer replicas are online than asked for, nor
for a few seconds after a WAIT timed out (a replica hanging or far behind).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import redis

logger = logging.getLogger(__name__)
# How stale the count of online replicas may be.
CHECK_EVERY_S = 1.0
# After a WAIT timed out, enqueues go on without waiting this long: a replica
# that is online but hangs or lags must not cost every request the timeout.
COOL_OFF_S = 5.0
# A marker whose WAIT confirmed in the same round trip is never read again; it
# needs to outlive only the WAIT, and a reply lost on its way back.
UNREAD_MARKER_TTL_MS = 60_000
# "As many replicas as asked for", when the primary will not tell.
UNKNOWN = 1_000_000


class ReplicationNotConfirmed(redis.RedisError):
    """The primary took the message, but too few replicas confirmed it in time.

    A failover now could lose it, so a caller that must not lose it (the outbox)
    keeps it, and later asks ``confirm_held`` instead of sending it again.
    """


@dataclass(frozen=True)
class ReplicaAck:
    replicas: int
    timeout_ms: int
    marker: str | None = None
    # How long the marker must last if the WAIT does not confirm: as long as
    # the caller may come back to ask.
    keep_ms: int = 0


# Set inside confirmed_by_replicas(); a context variable so one thread's outbox
# publish never makes another thread's enqueue wait.
_replica_ack: ContextVar[ReplicaAck | None] = ContextVar("replica_ack", default=None)


@contextlib.contextmanager
def confirmed_by_replicas(
    replicas: int, timeout_ms: int, *, marker: str | None = None, keep_ms: int = 0
) -> Iterator[None]:
    """Enqueues inside return only once ``replicas`` replicas hold the message, else
    raise ``ReplicationNotConfirmed``; ``marker`` is written with the message.
    With ``replicas=0`` only the marker is written (kept ``keep_ms``): a caller
    whose enqueue timed out asks for it before sending again. Neither: nothing."""
    ack = ReplicaAck(replicas, timeout_ms, marker, keep_ms)
    token = _replica_ack.set(ack if replicas > 0 or marker else None)
    try:
        yield
    finally:
        _replica_ack.reset(token)


def current_ack() -> ReplicaAck | None:
    return _replica_ack.get()


class ReplicaGauge:
    """Whether a WAIT for ``n`` replicas can succeed now, asked at most once a second."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._lock = threading.Lock()
        self._online: int | None = None
        self._until = 0.0
        self._suspended_until = 0.0

    def can_confirm(self, replicas: int) -> bool:
        now = time.monotonic()
        if now < self._suspended_until:
            return False
        if now >= self._until and self._lock.acquire(blocking=False):
            # One thread asks; the others go on with the last answer meanwhile.
            try:
                self._record(self._ask(), CHECK_EVERY_S)
            finally:
                self._lock.release()
        return (self._online or 0) >= replicas

    def timed_out(self, confirmed: int, replicas: int) -> None:
        logger.warning(
            "Redis WAIT: %d of %d replicas confirmed in time; enqueues stop waiting for %.0f s",
            confirmed,
            replicas,
            COOL_OFF_S,
        )
        self._suspended_until = time.monotonic() + COOL_OFF_S

    def _ask(self) -> int:
        try:
            info: dict[str, Any] = self.client.info("replication")
        except redis.ResponseError as exc:
            # INFO refused (an ACL, a renamed command): let WAIT itself tell.
            if self._online is None:
                logger.warning("Redis INFO refused (%s): waiting for replicas blind", exc)
            return UNKNOWN
        # connected_slaves also counts a replica still loading its first copy.
        replicas = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return sum(1 for replica in replicas if replica.get("state") == "online")

    def _record(self, online: int, fresh_for_s: float) -> None:
        known = self._online not in (None, UNKNOWN)
        if online != UNKNOWN and online != self._online and (known or online == 0):
            logger.warning("Redis primary: %d replica(s) online, was %s", online, self._online)
        self._online, self._until = online, time.monotonic() + fresh_for_s


_gauges: weakref.WeakKeyDictionary[redis.Redis, ReplicaGauge] = weakref.WeakKeyDictionary()
_gauges_lock = threading.Lock()


def gauge_for(client: redis.Redis) -> ReplicaGauge:
    """The process's one gauge for ``client`` (the broker's), shared by every thread."""
    with _gauges_lock:
        gauge = _gauges.get(client)
        if gauge is None:
            gauge = _gauges[client] = ReplicaGauge(client)
        return gauge


def will_wait(client: redis.Redis, ack: ReplicaAck) -> bool:
    """Whether an enqueue under ``ack`` waits for its replicas (WAIT) now."""
    return ack.replicas > 0 and gauge_for(client).can_confirm(ack.replicas)


def marker_ttl_ms(ack: ReplicaAck, waits: bool) -> int:
    """How long the marker written with the message lasts: a minute past a WAIT
    that may confirm at once, else as long as the caller may come back."""
    return UNREAD_MARKER_TTL_MS + ack.timeout_ms if waits else ack.keep_ms


def check_ack(client: redis.Redis, ack: ReplicaAck, waited: bool, replies: list[Any]) -> None:
    """Raise ``ReplicationNotConfirmed`` unless the enqueue's WAIT confirmed it."""
    if ack.replicas == 0:
        return
    confirmed = int(replies[-1]) if waited else 0
    if confirmed >= ack.replicas:
        return
    if waited:
        gauge_for(client).timed_out(confirmed, ack.replicas)
    if ack.marker:
        # Kept for the caller's next look. XX: only where the marker is, so a
        # failover since the enqueue cannot leave a marker without its message.
        with contextlib.suppress(redis.RedisError):
            client.set(ack.marker, 1, px=ack.keep_ms, xx=True)
    reason = f"waited {ack.timeout_ms} ms" if waited else "not waited: too few replicas online"
    raise ReplicationNotConfirmed(f"{confirmed} of {ack.replicas} replicas confirmed ({reason})")


def confirm_held(
    client: redis.Redis, marker: str, *, replicas: int, timeout_ms: int, keep_ms: int
) -> bool:
    """Whether the primary holds ``marker`` (so its message was taken and not lost).

    True once ``replicas`` replicas hold it too; False when the primary never
    had it or lost it (a failover): the caller sends the message again.
    Raises ``ReplicationNotConfirmed`` while the primary holds it alone.
    """
    pipe: Any = client.pipeline(transaction=False)
    # A write where the marker exists, none elsewhere: WAIT then counts the
    # replicas that hold everything up to the marker, the message included.
    pipe.set(marker, 1, px=keep_ms, xx=True)
    ack = ReplicaAck(replicas, timeout_ms)
    waited = replicas > 0 and gauge_for(client).can_confirm(replicas)
    if waited:
        pipe.execute_command("WAIT", replicas, timeout_ms)
    replies = pipe.execute()
    if not replies[0]:
        return False
    check_ack(client, ack, waited, replies)
    return True
