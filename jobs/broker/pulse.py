"""Heartbeats from outside the worker processes, for jobs that hold the GIL.

The ``Heartbeat`` thread (jobs.broker.workers) runs inside a worker process, so
a job that keeps the GIL (a C extension's long call: a solver, a codec) stops
it along with every other thread of the process. After ``heartbeat_timeout``
the worker looks dead and its messages are handed to other workers while it
still runs them: dramatiq issue 692, which Dramatiq's own worker shows too.

``pulse`` runs as a fork of rundramatiq's main process (a middleware's
``forks``: one per rundramatiq, sharing no GIL with the workers). Every beat
interval it beats for each worker process of the same rundramatiq that is still
alive: a sibling under the same parent, not a zombie, whose broker id it read
from the worker's presence key. A worker that dies stops being beaten at once
(its process is gone or a zombie), so redelivery after a crash is as fast as
before; a worker that is alive is never taken for dead, whatever its job does.

A stop does not end it at once. Dramatiq's main process sends SIGTERM to every
child together (a deploy's stop, or any one worker dying), and the workers then
finish their jobs for up to ``--worker-shutdown-timeout``: a job holding the GIL
through that needs its beats as much as before. So the pulse notes the signal
and ends once no worker of its own is left (or the main process is gone). It
cannot hold up the stop: the main process waits for its workers only, and then
terminates and joins its daemon forks, by which time the pulse has none left to
beat for and returns within a beat interval.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# How often the pulse looks through all of /proc for its siblings. Between two
# looks it reads only the siblings it found (a few files): on a host with
# thousands of processes a whole look takes a quarter of a second under load,
# and each beat waited for it.
SCAN_SECONDS = 2.0


def proc_stat(pid: int) -> tuple[str, int, str] | None:
    """(state, parent pid, start time) of ``pid`` from /proc, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), fields[19]


def live_siblings(parent: int, among: Iterable[int] | None = None) -> dict[int, str]:
    """pid -> start time of the running (not zombie) children of ``parent``: among
    the pids ``among``, or every process of the host when None."""
    if among is None:
        among = (int(entry.name) for entry in Path("/proc").glob("[0-9]*"))
    found = {}
    for pid in among:
        stat = proc_stat(pid) if pid != os.getpid() else None
        if stat is not None and stat[1] == parent and stat[0] not in "ZX":
            found[pid] = stat[2]
    return found


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _workers(
    client: Any, host: str, alive: dict[int, str], known: dict[tuple[int, str], str]
) -> dict[tuple[int, str], str]:
    """(pid, start time) -> broker id of the live siblings that are workers."""
    from jobs.broker.workers import PREFIX, read_presence

    found = {k: v for k, v in known.items() if alive.get(k[0]) == k[1]}
    for pid, started in alive.items():
        if (pid, started) not in found:
            # Written by the worker's own Heartbeat before its first job; a key
            # of an earlier run of this pid (a container restarted within its
            # TTL) names another start, or none if that run was of the version
            # before, and is left alone until the worker writes its own (the
            # pulse and its workers are one rundramatiq: one version).
            broker_id, key_started = read_presence(client.get(f"{PREFIX}{host}:{pid}"))
            if broker_id and key_started == started:
                found[(pid, started)] = broker_id
    return found


def _note_stop_requests() -> list[int]:
    """Replace the fork's exit-at-once handlers: a stop is noted, not obeyed at once."""
    requested: list[int] = []
    for name in ("SIGTERM", "SIGINT", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), lambda signum, _frame: requested.append(signum))
    return requested


def pulse() -> int:
    """Beat for this rundramatiq's live worker processes until they have all stopped."""
    stop_requested = _note_stop_requests()
    import django

    django.setup()
    from jobs.broker import clock, redis_broker, registry
    from jobs.broker.timeouts import use_worker_timeouts
    from jobs.broker.workers import PREFIX, TTL_SECONDS, beat_interval, presence_value

    use_worker_timeouts(redis_broker())  # a worker's, not a request's: it beats for them
    parent = os.getppid()
    host = socket.gethostname()
    client = redis_broker().client
    known: dict[tuple[int, str], str] = {}  # (pid, start time) -> broker id
    interval = beat_interval()
    alive, scanned = live_siblings(parent), time.monotonic()
    while os.getppid() == parent:
        began = time.monotonic()
        alive = live_siblings(parent, list(alive))
        try:
            known = _workers(client, host, alive, known)
            if known:
                now_ms = int(time.time() * 1000)
                pipe = client.pipeline(transaction=False)
                clock.queue_beat(pipe, redis_broker().namespace, list(known.values()))
                for (pid, started), broker_id in known.items():
                    value = presence_value(broker_id, started)
                    pipe.set(f"{PREFIX}{host}:{pid}", value, ex=TTL_SECONDS)
                    registry.beat_for(pipe, host, pid, broker_id, now_ms)
                pipe.execute()
        except Exception:
            logger.warning("Worker pulse failed; trying again", exc_info=True)
        # Only the workers count: they are what a stop lets run on. Checked
        # after a beat, so that a stop that came during boot still beats once
        # for the workers it finds.
        if stop_requested and not any(alive.get(pid) == started for pid, started in known):
            logger.info("The workers have stopped; so does the pulse.")
            break
        if time.monotonic() - scanned >= SCAN_SECONDS:  # new siblings, after the beat
            alive, scanned = live_siblings(parent), time.monotonic()
        # The next beat an interval after this one began, however long it took.
        time.sleep(max(0.0, interval - (time.monotonic() - began)))
    return 0
