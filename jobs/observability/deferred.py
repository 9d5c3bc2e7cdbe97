"""Metric writes from per-job code paths, applied by one thread a moment later.

In multiprocess mode (the shipped settings) every prometheus_client write takes
one lock that all of a process's metrics share, then writes the metrics file.
Eight worker threads writing four or five figures per job queue on that lock:
a thread preempted while it holds it (the GIL's switch interval) makes the
others sleep on it and be woken one by one, and that convoy cost more CPU than
the writes themselves (8 threads, 4 writes per loop: 51-63 us of CPU per loop
against 7-8 us for one thread; issue 17).

Here a hot path only appends to a deque (thread-safe, no lock of ours); a daemon
thread sums what came per series and writes each total once per
``FLUSH_INTERVAL``, alone on prometheus' lock. ``GET /metrics`` flushes its own
process first, so a scrape is current for that process and at most
``FLUSH_INTERVAL`` behind for the others (a scrape interval is seconds). What is
still pending is written at exit, and a forked child starts empty: the parent
writes what it had.
"""

from __future__ import annotations

import os
import threading
from bisect import bisect_left
from collections import deque
from typing import Any

from jobs.observability.flushing import PeriodicFlush


class DeferredWrites(PeriodicFlush):
    flusher_name = "metric-writes"

    def __init__(self) -> None:
        self._adds: deque[tuple[Any, float]] = deque()
        self._observations: deque[tuple[Any, float]] = deque()
        self._flushing = threading.Lock()  # one flush at a time: totals go out in order

    def add(self, child: Any, amount: float = 1.0) -> None:
        """``child.inc(amount)`` soon: a Counter's or Gauge's series (a Gauge may go down)."""
        self._adds.append((child, amount))
        self._ensure_flusher()

    def observe(self, child: Any, value: float) -> None:
        """``child.observe(value)`` soon: a Histogram's series."""
        self._observations.append((child, value))
        self._ensure_flusher()

    def flush(self) -> None:
        """Write everything added so far to the metrics."""
        with self._flushing:
            totals: dict[Any, float] = {}
            for child, amount in _drain(self._adds):
                totals[child] = totals.get(child, 0.0) + amount
            histograms: dict[Any, tuple[list[int], list[float]]] = {}
            for child, value in _drain(self._observations):
                counts, sums = histograms.get(child) or histograms.setdefault(
                    child, ([0] * len(child._upper_bounds), [0.0])
                )
                sums[0] += value
                # The first bucket whose bound holds the value, as observe() picks
                # it (the last bound is +Inf; a NaN lands in none, there too).
                index = bisect_left(child._upper_bounds, value)
                if index < len(counts) and value <= child._upper_bounds[index]:
                    counts[index] += 1
            for child, total in totals.items():
                if total:
                    child.inc(total)
            for child, (counts, sums) in histograms.items():
                # Histogram has no "observe these n values": its sum and bucket
                # series, written once each (what observe() writes per value).
                child._sum.inc(sums[0])
                for index, count in enumerate(counts):
                    if count:
                        child._buckets[index].inc(count)

    def after_fork_in_child(self) -> None:
        """Start from nothing: the parent writes what it had pending."""
        self._adds.clear()
        self._observations.clear()
        self._flushing = threading.Lock()  # the parent's may have been held at the fork
        self._forget_flusher()


def _drain(pending: deque[tuple[Any, float]]) -> list[tuple[Any, float]]:
    # popleft() one at a time: appends go on meanwhile, and each entry is taken once.
    taken = []
    try:
        while True:
            taken.append(pending.popleft())
    except IndexError:
        return taken


writes = DeferredWrites()
os.register_at_fork(after_in_child=writes.after_fork_in_child)
