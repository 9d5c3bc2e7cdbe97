"""CPU time per job, by the kind of process that spent it (Linux's /proc).

A throughput ratio on two cores says how much of the machine the full stack
leaves unused, which moves with the machine's hour (another tenant, the
clock): on 2026-12-01 the same code measured 0.88x and 0.67x for PostgreSQL
2x8 a few hours apart. CPU seconds per job move far less, and say where the
cost is: the worker processes (middleware and the ledger writer, GIL
included), PostgreSQL's backends, redis-server. Taken over a drain, from the
first acknowledged job to the last recorded one, for the processes of these
kinds alive at its end (a process started meanwhile counts from zero).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable
from pathlib import Path

# Kinds, by what a process's command line starts with or holds.
WORKERS, POSTGRES, REDIS = "workers", "postgres", "redis"
KINDS = (WORKERS, POSTGRES, REDIS)
_PROC = Path("/proc")

Snapshot = dict[int, tuple[str, float]]  # pid -> (kind, CPU seconds so far)


def _kind(command: str) -> str | None:
    if "dramatiq" in command:
        return WORKERS
    if command.split(" ", 1)[0].endswith(("postgres", "postgres:")):  # server, backends
        return POSTGRES
    if "redis-server" in command:
        return REDIS
    return None


def snapshot() -> Snapshot:
    """CPU seconds (user + system, all threads) of every process of a known kind."""
    if not _PROC.is_dir():
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    found: Snapshot = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        kind = _kind(command)
        if kind is None:
            continue
        # After the command name, which may hold spaces and parentheses:
        # state is field 0, utime field 11, stime field 12.
        fields = stat.rsplit(")", 1)[1].split()
        found[int(entry.name)] = (kind, (int(fields[11]) + int(fields[12])) / tick)
    return found


def per_job(before: Snapshot, after: Snapshot, jobs: int) -> dict[str, float]:
    """Microseconds of CPU per job, by kind, spent between two snapshots."""
    spent = dict.fromkeys(KINDS, 0.0)
    for pid, (kind, seconds) in after.items():
        earlier = before.get(pid)
        spent[kind] += seconds - (earlier[1] if earlier and earlier[0] == kind else 0.0)
    return {kind: seconds / jobs * 1e6 for kind, seconds in spent.items()}


def medians(drains: Iterable[dict[str, float]]) -> dict[str, float]:
    """Each kind's median over several drains (their sum: ``total``)."""
    drains = list(drains)
    if not drains:
        return {}
    found = {kind: statistics.median(d[kind] for d in drains) for kind in KINDS}
    found["total"] = statistics.median(sum(d[k] for k in KINDS) for d in drains)
    return found


def describe(costs: dict[str, float]) -> str:
    """``workers 470 + postgres 86 + redis 27 = 583 us/job`` (kinds that spent any)."""
    if not costs:
        return "no /proc here"
    parts = [f"{kind} {costs[kind]:.0f}" for kind in KINDS if costs[kind] >= 0.5]
    return f"{' + '.join(parts) or '0'} = {costs['total']:.0f} us/job"
