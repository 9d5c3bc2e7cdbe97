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
  (``jobs.broker.registry``) lists as lost, unless a live process has the same
  host and pid (a restarted container reuses both, and its file).

Counters and histograms stay: a dead process's finished jobs were finished.
A web or scheduler process on another host has no registry record: its live
gauges (locks held) stay until its host name and pid write again.
"""

from __future__ import annotations

import contextlib
import logging
import os
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

_other_hosts_checked = float("-inf")
_lock = threading.Lock()


def _owner(file_name: str) -> tuple[str, int] | None:
    """(host, pid) of a live gauge file ``gauge_live<mode>_<host>-<pid>.db``."""
    if not (file_name.startswith("gauge_live") and file_name.endswith(".db")):
        return None
    # The host part has no "_" (metrics.process_identifier replaces them).
    parts = file_name[: -len(".db")].split("_", 2)
    if len(parts) != 3:
        return None
    host, _, pid = parts[2].rpartition("-")
    return (host, int(pid)) if host and pid.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def _lost_elsewhere(owners: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """Those of ``owners`` (other hosts) the worker registry says were lost."""
    from jobs.broker import registry

    lost: set[tuple[str, int]] = set()
    live: set[tuple[str, int]] = set()
    for record in registry.recent():
        owner = (record.host.replace("_", "-"), record.pid)
        if owner in owners:
            (live if record.present else lost).add(owner)
    return lost - live


def sweep(directory: str) -> list[str]:
    """Delete the live gauge files of the dead processes writing to ``directory``;
    the process identifiers whose files went."""
    global _other_hosts_checked
    here = metrics.host_identifier()
    owners: set[tuple[str, int]] = set()
    with contextlib.suppress(OSError):
        owners = {owner for name in os.listdir(directory) if (owner := _owner(name))}
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
            dead |= _lost_elsewhere(elsewhere)
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
