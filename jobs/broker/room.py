"""Wake a worker's consumer thread as soon as the worker has room for messages.

Dramatiq's Redis consumer fetches up to its prefetch (twice the worker threads
by default). Holding that many, it sleeps and looks again: 2.5-5 ms, then
twice as long each time it finds no room, up to the worker timeout. Worker
threads that finish short jobs meanwhile empty the work queue and wait (see
README, "Performance": with no-op jobs, most of a drain).

Here the consumer waits on an event instead, bounded by the same backoff (so
its loop still turns as often: delayed messages, a stop), and the worker
thread whose ack makes room sets it. "Room" is not one free slot, which would
mean a Redis round trip per message with fast jobs: the consumer refills once
half its prefetch is free (every thread still has a message with Dramatiq's
default prefetch), or as soon as no message waits in the work queue (a thread
is about to go idle: long jobs with a prefetch below twice the threads).

Delay queues keep Dramatiq's rule: their messages wait for an eta, not a
thread, and the consumer itself acks them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any


def has_room(outstanding: int, prefetch: int, work_queue: queue.Queue[Any] | None) -> bool:
    """Whether a consumer holding ``outstanding`` messages should fetch more."""
    if outstanding >= prefetch:
        return False
    if work_queue is None or outstanding <= prefetch // 2:
        return True
    # Read without the queue's lock: a length is enough, and worker threads
    # call this for every job (a lock taken that often convoys; see
    # jobs.ledger.writer.BatchWriter.add).
    return not work_queue.queue


def work_queue_of(thread: threading.Thread) -> queue.Queue[Any] | None:
    """The work queue a Dramatiq consumer thread feeds (None elsewhere: a
    consumer iterated by hand, as in tests, refills whenever it may)."""
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
