"""Messages a worker took and then lost from memory while Redis was away.

A fetch moves messages into this worker's ack set on Redis; only an ack, a
nack or a requeue takes them out, and Dramatiq's maintenance requeues the ack
sets of *dead* workers only. Two paths drop taken messages from memory while
the worker lives on, when Redis is unreachable (a restart, a failover):

- Dramatiq's ``ConsumerThread`` answers a connection error with
  ``self.delay_queue = PriorityQueue()``: every delayed message and retry its
  delay-queue consumer was holding until its time is forgotten;
- a consumer closed then cannot hand back its prefetched messages
  (``LedgerOrderedConsumer.close``).

Left alone, those messages would wait in the ack set until the worker process
stops. So each consumer thread keeps, across the consumers it creates (one
after every error), the delay-queue messages it was given and has not settled,
and the ids it could not hand back; its next consumer hands back, at its first
fetch, every one of them no longer in the thread's delay queue.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ThreadMemory:
    """What one consumer thread holds of its queue, whichever consumer it runs now."""

    # message id -> redis message id: delay-queue messages given to the thread
    # and not yet acked, nacked or requeued
    delayed: dict[str, str] = field(default_factory=dict)
    # redis message ids a closing consumer could not hand back
    left: set[str] = field(default_factory=set)

    def lost(self, thread: threading.Thread) -> tuple[list[str], list[str]]:
        """(redis ids to hand back, message ids they settle) given what ``thread`` holds."""
        held = _delay_queue_ids(thread)
        lost = {m: r for m, r in self.delayed.items() if m not in held}
        return [*self.left, *lost.values()], list(lost)

    def handed_back(self, message_ids: list[str]) -> None:
        for message_id in message_ids:
            self.delayed.pop(message_id, None)
        self.left.clear()


def memory_of(thread: threading.Thread) -> ThreadMemory:
    """The memory kept on ``thread`` (the consumer thread outlives its consumers)."""
    memory: ThreadMemory | None = getattr(thread, "_jobs_memory", None)
    if memory is None:
        memory = ThreadMemory()
        thread._jobs_memory = memory  # type: ignore[attr-defined]
    return memory


def _delay_queue_ids(thread: threading.Thread) -> set[str]:
    # Dramatiq's ConsumerThread.delay_queue: a PriorityQueue of _WorkQueueItem.
    # Read in the consumer thread itself, the only one that changes it.
    queue: Any = getattr(thread, "delay_queue", None)
    if queue is None:
        return set()
    return {item.message.message_id for item in list(queue.queue)}
