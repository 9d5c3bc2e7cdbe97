"""How long a Redis client waits, per kind of process (seconds).

Every process starts with ``REQUEST``'s: the settings builders
(``dramatiq_broker()``, ``redis_cache()``) write them, so a web request, a
shell or a management command waits at most one short spell on a hung Redis.
A Dramatiq worker and the scheduler raise theirs to ``WORKER_BROKER`` and
``WORKER_CACHE`` when they boot (``jobs.broker.timeouts``). A timeout set in
the URL's query (``?socket_timeout=5``) is kept.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timeouts:
    """Seconds a client waits to connect, and for each reply."""

    connect: float
    read: float


# Above the outbox's default wait for a replica (JOBS_OUTBOX_WAIT_TIMEOUT_MS,
# 0.5 s), which rides in the enqueue's own round trip.
REQUEST = Timeouts(connect=0.5, read=0.75)
# A worker's fetch blocks on Redis for up to half the read timeout
# (jobs.broker.wakeup); its scripts may run longer than a request's commands.
WORKER_BROKER = Timeouts(connect=2.0, read=10.0)
WORKER_CACHE = Timeouts(connect=2.0, read=2.0)
