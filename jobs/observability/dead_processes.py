"""The live gauges of processes that died without exiting (SIGKILL, OOM kill).

In multiprocess mode each process writes its own files, and the ``live*`` gauge
modes (``jobs_in_progress``, ``jobs_locks_held``, ...) count a process only
while its live files exist; a process deletes them as it exits
(``jobs.middleware.metrics``). A process killed with SIGKILL never does: a
worker killed in the middle of a job showed that job in progress, and the
"stuck jobs" figures it feeds, for as long as the directory lived.

So each scrape first deletes the live files of the processes that are gone
(``sweep``):

- on this host (the file's host is ours), a pid that no longer exists;
- on another host writing to the same directory (containers sharing one
  volume, whose pids this host cannot see), a worker process the registry
  (``jobs.broker.registry``) lists as lost for ``LOST_AFTER_S``, unless a live
  process has the same host and pid or its files changed since its last beat
  (a restarted container reuses both).

"This host" is the host name: processes that share a host name must share a
pid namespace (true of a machine, and of docker-compose, where each container
has its own host name; not of the containers of a Kubernetes pod, which must
not share one metrics directory: their file names would collide anyway).
A process also removes, as it starts, live files a dead process of the same
host and pid left (``metrics.forget_previous_process``), so a restarted
container does not inherit its predecessor's jobs in progress.

Counters and histograms stay: a dead process's finished jobs were finished.
A web or scheduler process on another host has no registry record: its live
gauges (locks held) stay until its host name and pid write again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time

import redis
from prometheus_client import multiprocess

from jobs.consistency.reachability import UNREACHABLE, note_unreachable, recently_unreachable
from jobs.observability import metrics

logger = logging.getLogger(__name__)

# How often one process asks the registry about other hosts' files (two Redis
# round trips); this host's own files are checked at every scrape.
OTHER_HOSTS_EVERY_S = 30.0
# How long a worker of another host must have been silent before its live files
# go: a missing presence key (30 s) alone is also a worker paused, or cut off
# from Redis a while, that comes back and would never recreate the files.
LOST_AFTER_S = 600.0

_other_hosts_checked = float("-inf")
_lock = threading.Lock()


# ``gauge_live<mode>_<host>-<pid>.db``; the host part has no "_"
# (metrics.process_identifier replaces them). ASCII digits, at most a pid's.
_LIVE_FILE = re.compile(r"gauge_live[a-z]+_(?P<host>[^_]+)-(?P<pid>[0-9]{1,9})\.db", re.ASCII)


def _owner(file_name: str) -> tuple[str, int] | None:
    """(host, pid) of a live gauge file; None for any other name."""
    match = _LIVE_FILE.fullmatch(file_name)
    return (match["host"], int(match["pid"])) if match else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # someone else's process (or no pid of ours): left alone
    return True


def _lost_elsewhere(
    directory: str, names: list[str], owners: set[tuple[str, int]]
) -> set[tuple[str, int]]:
    """Those of ``owners`` (other hosts) the worker registry says were lost:
    silent for ``LOST_AFTER_S``, no live record of the same host and pid, and
    no live file of theirs written since (a newer process of that host and pid,
    not registered yet)."""
    from jobs.broker import registry

    lost: dict[tuple[str, int], int] = {}
    live: set[tuple[str, int]] = set()
    now_ms = time.time() * 1000
    for record in registry.recent():
        owner = (record.host.replace("_", "-"), record.pid)
        if owner not in owners:
            continue
        if record.present or now_ms - record.last_beat_ms < LOST_AFTER_S * 1000:
            live.add(owner)
        else:
            lost[owner] = max(lost.get(owner, 0), record.last_beat_ms)
    gone = set()
    for owner, last_beat_ms in lost.items():
        if owner not in live and _files_older_than(directory, names, owner, last_beat_ms):
            gone.add(owner)
    return gone


def _files_older_than(directory: str, names: list[str], owner: tuple[str, int], ms: float) -> bool:
    """Whether every live file of ``owner`` was last changed before ``ms``."""
    for name in names:  # listed once per sweep
        if _owner(name) == owner:
            try:
                stat = os.stat(os.path.join(directory, name))
            except FileNotFoundError:
                continue
            if stat.st_mtime * 1000 >= ms:  # created or written since
                return False
    return True


def sweep(directory: str) -> list[str]:
    """Delete the live gauge files of the dead processes writing to ``directory``;
    the process identifiers whose files went."""
    global _other_hosts_checked
    here = metrics.host_identifier()
    names: list[str] = []
    with contextlib.suppress(OSError):
        names = os.listdir(directory)
    owners = {owner for name in names if (owner := _owner(name))}
    dead = {(host, pid) for host, pid in owners if host == here and not _alive(pid)}
    elsewhere = {owner for owner in owners if owner[0] != here}
    now = time.monotonic()
    # Not while Redis did not answer a moment ago: a hung Redis would cost the
    # scrape a read timeout (as for the collector's figures).
    due = now - _other_hosts_checked >= OTHER_HOSTS_EVERY_S and not recently_unreachable()
    if elsewhere and due:
        with _lock:
            _other_hosts_checked = now
        try:
            dead |= _lost_elsewhere(directory, names, elsewhere)
        except redis.RedisError as exc:
            # The scrape goes on; the next one after the interval asks again.
            if isinstance(exc, UNREACHABLE):
                note_unreachable(exc)
            logger.info("Metrics: the worker registry did not answer (%s)", type(exc).__name__)
    gone = sorted(f"{host}-{pid}" for host, pid in dead)
    for identifier in gone:
        # Two scrapes at once may both delete: the second finds nothing.
        with contextlib.suppress(FileNotFoundError):
            multiprocess.mark_process_dead(identifier, directory)  # type: ignore[no-untyped-call]
    return gone
