"""Worker liveness: one heartbeat thread per worker process.

Dramatiq's Redis broker records a worker's heartbeat (``<ns>:__heartbeats__``,
a sorted set of broker ids by last-seen time) only as a side effect of the
commands its consumers send. A process whose consumers are all busy with long
jobs sends none, so after ``heartbeat_timeout`` it looks dead and its messages
are handed to other workers while it still runs them (dramatiq issue 692). And
a dead worker's messages come back only during "maintenance", which the broker
runs on ~0.1% of commands: minutes at low traffic.

So each worker process runs a ``Heartbeat`` thread that, every
``beat_interval()`` seconds and whatever its consumers do:

- refreshes the process's broker heartbeat (a ``ZADD`` like dispatch.lua's);
- refreshes its presence key ``jobs:worker:<host>:<pid>`` (value: broker id),
  and in the same round trip its record for the admin's workers page, which
  outlives the key by an hour (``jobs.broker.registry``);
- runs the broker's maintenance on every declared queue, so the unacked
  messages of a worker dead for ``heartbeat_timeout`` are back in their queue
  within one interval after that, with only workers running.

``holder_alive(identity)`` answers the question the broker's maintenance asks
("is this broker id's heartbeat younger than the timeout?"), so an idempotency
claim is taken over exactly when its worker's messages are redelivered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time

from jobs.broker import clock, redis_broker, registry
from jobs.broker.pulse import proc_stat

logger = logging.getLogger(__name__)

PREFIX = "jobs:worker:"
TTL_SECONDS = 30
# At most this long between beats; shorter when the heartbeat timeout is short
# (several beats must fit in one timeout, or one slow beat looks like a death).
MAX_BEAT_SECONDS = 2.0
BEATS_PER_TIMEOUT = 5

_identity: str | None = None


def _key() -> str:
    return f"{PREFIX}{socket.gethostname()}:{os.getpid()}"


def process_start(pid: int) -> str | None:
    """When process ``pid`` started (``/proc``'s field 22, ticks since boot), None if
    unknown: with the pid, it tells one run of a process from another."""
    stat = proc_stat(pid)
    return stat[2] if stat is not None else None


def presence_value(broker_id: str, started: str | None) -> str:
    """A presence key's value: the broker id and the start of the process it is for.

    A host and a pid do not name a process for long: a container restarted
    within the key's TTL has the same hostname and, in a new pid namespace,
    the same pids, and the old run's key would still name the old broker id.
    The pulse beats only for a key whose start matches the live process.
    """
    return broker_id if started is None else f"{broker_id} {started}"


def read_presence(value: bytes | str | None) -> tuple[str | None, str | None]:
    """(broker id, process start) of a presence key's value; the start is None in
    a value written before it was kept (or where /proc is not)."""
    if value is None:
        return None, None
    text = value.decode() if isinstance(value, bytes) else value
    broker_id, _, started = text.partition(" ")
    return broker_id, started or None


def heartbeats_key() -> str:
    return f"{redis_broker().namespace}:__heartbeats__"


def beat_interval() -> float:
    timeout_s = float(redis_broker().heartbeat_timeout) / 1000
    return min(MAX_BEAT_SECONDS, timeout_s / BEATS_PER_TIMEOUT)


def identity() -> str | None:
    """This process's broker id while its heartbeat runs (None elsewhere: web, shell)."""
    return _identity


def beat() -> None:
    broker = redis_broker()
    now_ms = int(time.time() * 1000)
    pipe = broker.client.pipeline(transaction=False)
    clock.queue_beat(pipe, broker.namespace, [broker.broker_id])
    pipe.set(_key(), presence_value(broker.broker_id, _own_start()), ex=TTL_SECONDS)
    # The record the admin's workers page keeps for an hour, in the same round trip.
    registry.beat(pipe, broker.broker_id, now_ms)
    pipe.execute()


_started: dict[int, str | None] = {}  # by pid: a forked child reads its own


def _own_start() -> str | None:
    pid = os.getpid()
    if pid not in _started:
        _started[pid] = process_start(pid)
    return _started[pid]


def gone() -> None:
    broker = redis_broker()
    pipe = broker.client.pipeline(transaction=False)
    pipe.delete(_key())
    registry.stopped(pipe, broker.broker_id, int(time.time() * 1000))
    pipe.execute()


def live_workers() -> list[str]:
    client = redis_broker().client
    return sorted(
        k.decode()[len(PREFIX) :] for k in client.scan_iter(match=f"{PREFIX}*", count=500)
    )


def presence_exists(host: str, pid: int) -> bool:
    return bool(redis_broker().client.exists(f"{PREFIX}{host}:{pid}"))


def holder_alive(holder: str) -> bool:
    """True while broker id ``holder`` has a heartbeat younger than the timeout, or
    Redis came back from an outage too recently to judge (``jobs.broker.clock``)."""
    broker = redis_broker()
    return clock.holder_alive(broker.client, broker.namespace, holder, broker.heartbeat_timeout)


class Heartbeat:
    """A daemon thread that beats and runs maintenance until stopped."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="jobs-heartbeat", daemon=True)
        self.longest_gap = 0.0  # seconds between two successful beats, for the logs

    def start(self) -> None:
        global _identity
        registry.begin()
        # The first beat before any job starts: a claim must never name a
        # holder that has no heartbeat yet (it would look dead).
        with contextlib.suppress(Exception):
            beat()
        _identity = redis_broker().broker_id
        self.thread.start()

    def stop(self) -> None:
        global _identity
        self.stopping.set()
        _identity = None
        with contextlib.suppress(Exception):  # Redis down: the key expires on its own
            gone()

    def _run(self) -> None:
        from jobs.broker.queues import force_maintenance

        interval = beat_interval()
        last = time.monotonic()
        while not self.stopping.wait(interval):
            # A failed beat is retried next time; a long outage shows as "worker absent".
            try:
                beat()
            except Exception:
                logger.warning("Worker heartbeat failed", exc_info=True)
                continue
            now = time.monotonic()
            gap, last = now - last, now
            if gap > self.longest_gap:
                self.longest_gap = gap
                if gap > 2 * interval:
                    logger.warning("Worker heartbeat came %.1f s after the last one", gap)
            with contextlib.suppress(Exception):
                force_maintenance()
