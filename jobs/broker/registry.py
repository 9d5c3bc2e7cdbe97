"""A record of every worker process seen in the last hour, for the admin's workers page.

A presence key (``jobs.broker.workers``) says a process is alive and expires
30 s after its last beat; the broker's heartbeat set forgets a dead worker at
its next maintenance. Neither can say which processes were lost an hour ago,
so each beat also writes, in the same pipeline (no extra round trip):

- ``jobs:process:<host>:<pid>:<broker id>``, a hash: host, pid, queues, threads,
  started_at, last_beat (and stopped_at after a clean stop), all times in ms;
  it expires an hour after the last beat;
- ``jobs:processes``, a sorted set of those members by last beat, from which
  every write prunes the entries older than an hour.

The member holds host, pid and broker id, so a reader finds each process's
presence key in the same round trip as its hash, and a pid reused by a later
process (a restarted container) is a new member, not an overwrite of the
process that was lost.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from dramatiq.common import q_name
from dramatiq.worker import ConsumerThread, WorkerThread

from jobs.broker import redis_broker

INDEX = "jobs:processes"
PREFIX = "jobs:process:"
KEEP_SECONDS = 3600
# The hash outlives its index entry by a little, so a reader never finds a
# member whose hash has just expired.
HASH_TTL_SECONDS = KEEP_SECONDS + 60
# More than any deployment runs in an hour; the page shows the newest first.
READ_LIMIT = 1000

HOST = socket.gethostname()

_started_ms: int | None = None  # this process's current heartbeat run


@dataclass(frozen=True)
class Record:
    """One worker process as its last beat left it."""

    broker_id: str
    host: str
    pid: int
    queues: tuple[str, ...]
    threads: int | None  # None: only the pulse has written this record
    started_at_ms: int | None
    last_beat_ms: int
    stopped_at_ms: int | None
    present: bool  # its presence key still names it: alive for the rest of the platform

    @property
    def stopped(self) -> bool:
        """Stopped cleanly (not lost): the stop came after the start of its last run."""
        return self.stopped_at_ms is not None and self.stopped_at_ms >= (self.started_at_ms or 0)


def _member(host: str, pid: int, broker_id: str) -> str:
    return f"{host}:{pid}:{broker_id}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _write(pipe: Any, member: str, now_ms: int, fields: Mapping[str, str | int]) -> None:
    key = PREFIX + member
    pipe.hset(key, mapping={**fields, "last_beat": now_ms})
    pipe.expire(key, HASH_TTL_SECONDS)
    pipe.zadd(INDEX, {member: now_ms})
    pipe.zremrangebyscore(INDEX, "-inf", now_ms - KEEP_SECONDS * 1000)


def running_here() -> tuple[tuple[str, ...], int]:
    """(queues consumed, worker threads) of every dramatiq Worker in this process.

    Read from the threads themselves: one process may run several Workers (an
    embedded worker, the tests), and the heartbeat that writes the record is
    started without a reference to any of them.
    """
    queues: set[str] = set()
    threads = 0
    for thread in threading.enumerate():
        if isinstance(thread, ConsumerThread):
            queues.add(q_name(thread.queue_name))
        elif isinstance(thread, WorkerThread):
            threads += 1
    return tuple(sorted(queues)), threads


def begin() -> None:
    """A heartbeat run starts in this process: its record's started_at from now on."""
    global _started_ms
    _started_ms = int(time.time() * 1000)


def beat(pipe: Any, broker_id: str, now_ms: int) -> None:
    """Add this process's record to the heartbeat's pipeline (four cheap commands).

    Every field, every beat: a Redis that lost its data (a restart without
    persistence) has the whole record back at the next beat.
    """
    global _started_ms
    if _started_ms is None:  # a beat outside a Heartbeat run (a test, a shell)
        _started_ms = now_ms
    queues, threads = running_here()
    fields: dict[str, str | int] = {
        "host": HOST,
        "pid": os.getpid(),
        "queues": ",".join(queues),
        "threads": threads,
        "started_at": _started_ms,
    }
    _write(pipe, _member(HOST, os.getpid(), broker_id), now_ms, fields)


def beat_for(pipe: Any, host: str, pid: int, broker_id: str, now_ms: int) -> None:
    """The pulse's beat for a sibling worker process: its last beat only."""
    _write(pipe, _member(host, pid, broker_id), now_ms, {"host": host, "pid": pid})


def stopped(pipe: Any, broker_id: str, now_ms: int) -> None:
    """Mark this process's record as stopped cleanly (not lost).

    A beat that was under way when the heartbeat stopped may land after this;
    it keeps the run's started_at, so the record still reads as stopped.
    """
    key = PREFIX + _member(HOST, os.getpid(), broker_id)
    pipe.hset(key, "stopped_at", now_ms)
    pipe.expire(key, HASH_TTL_SECONDS)  # a record no beat wrote (Redis flushed) expires too


def _int(fields: Mapping[str, str], name: str) -> int | None:
    value = fields.get(name, "")
    return int(value) if value.isdigit() else None


def recent() -> list[Record]:
    """Every process that beat in the last hour, the latest beat first: two round trips."""
    from jobs.broker.workers import PREFIX as PRESENCE
    from jobs.broker.workers import read_presence

    client = redis_broker().client
    since_ms = int(time.time() * 1000) - KEEP_SECONDS * 1000
    entries = cast(
        list[tuple[bytes, float]],
        client.zrevrangebyscore(INDEX, "+inf", since_ms, start=0, num=READ_LIMIT, withscores=True),
    )
    members = [(_text(member), int(score)) for member, score in entries]
    if not members:
        return []
    pipe = client.pipeline(transaction=False)
    for member, _score in members:
        host, pid, _broker_id = member.rsplit(":", 2)
        pipe.hgetall(PREFIX + member)
        pipe.get(f"{PRESENCE}{host}:{pid}")
    replies = pipe.execute()
    records = []
    for (member, last_beat_ms), raw, presence in zip(
        members, replies[::2], replies[1::2], strict=True
    ):
        host, pid, broker_id = member.rsplit(":", 2)
        fields = {_text(k): _text(v) for k, v in raw.items()}
        queues = fields.get("queues", "")
        records.append(
            Record(
                broker_id=broker_id,
                host=host,
                pid=int(pid),
                queues=tuple(queues.split(",")) if queues else (),
                threads=_int(fields, "threads"),
                started_at_ms=_int(fields, "started_at"),
                last_beat_ms=last_beat_ms,
                stopped_at_ms=_int(fields, "stopped_at"),
                present=read_presence(presence)[0] == broker_id,
            )
        )
    return records
