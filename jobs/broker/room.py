"""Wake a worker's consumer thread as soon as the worker has room for messages.

Dramatiq's Redis consumer fetches up to its prefetch (twice the worker threads
by default). Holding that many, it sleeps and looks again: 2.5-5 ms, then
twice as long each time it finds no room, up to the worker timeout. Worker
threads that finish short jobs meanwhile empty the work queue and wait: a
sampler of ``sys._current_frames()`` every 2 ms in a 2x8 SQLite drain of no-op
jobs found the consumer in that sleep in 85% of samples and the eight worker
threads waiting on an empty work queue in 99-100% (commit c2e20c2).

Here a full consumer waits on an event instead, bounded by the same backoff,
and an ack (or nack) that leaves enough room sets it; when the wait ends the
consumer fetches by Dramatiq's own rule (whatever room there is), so it never
fetches later than Dramatiq's consumer would. "Enough room" is not one free
slot, which with fast jobs would mean a Redis round trip per message: half
the prefetch free (every thread still has a message with Dramatiq's default
prefetch), or no message left waiting in the work queue (a thread is about to
go idle: long jobs with a prefetch below twice the threads).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


def worth_waking(outstanding: int, prefetch: int, work_queue: queue.Queue[Any] | None) -> bool:
    """Whether a full consumer, now holding ``outstanding`` messages, should fetch
    at once rather than at the end of its backoff."""
    if outstanding >= prefetch:
        return False
    if work_queue is None or outstanding <= prefetch // 2:
        return True
    # Read without the queue's lock: a length is enough, and worker threads
    # call this after every job while their consumer waits (a lock taken that
    # often convoys; see jobs.ledger.writer.BatchWriter.add).
    return not work_queue.queue


def work_queue_of(thread: threading.Thread) -> queue.Queue[Any] | None:
    """The work queue a Dramatiq consumer thread feeds (None elsewhere: a
    consumer iterated by hand, as in tests, is woken by any room)."""
    work_queue = getattr(thread, "work_queue", None)
    return work_queue if isinstance(work_queue, queue.Queue) else None


class Room:
    """An event the consumer thread waits on and worker threads set."""

    def __init__(self) -> None:
        self.event = threading.Event()
        # Read by every ack without a lock: set only while the consumer waits,
        # so acks at other times cost one attribute read.
        self.awaited = False

    def wait(self, ready: Callable[[], bool], timeout: float) -> None:
        """Return once ``ready()`` may be true (a worker said so) or after ``timeout`` s."""
        # Cleared and flagged before the check: an ack after the check sees the
        # flag and sets the event; one before it is seen by the check.
        self.event.clear()
        self.awaited = True
        try:
            if not ready():
                self.event.wait(timeout)
        finally:
            self.awaited = False

    def made(self, ready: Callable[[], bool]) -> None:
        """Called after an ack: wake the consumer if it waits and ``ready()``."""
        if self.awaited and ready():
            self.event.set()
