"""A web request pays for an unreachable Redis once, not once per call.

A hung Redis (a stalled server, a partition) answers nothing: each command
waits out the client's read timeout. A signup touched Redis four times (rate
limit, outbox publish, cache invalidation, and redis-py's reconnects): 13-16 s
measured under gunicorn with the server SIGSTOPped, and ``/healthz`` 12 s.
After one timeout or refused connection, this process treats Redis as
unreachable for ``QUIET_S``: the callers that have a degraded answer give it at
once (the rate limit allows, the cache reads the database, the outbox leaves the
row to its relay, ``/healthz`` says down) instead of waiting again. The first
command after the quiet spell tries Redis for real.

Only callers with a degraded answer consult it: the worker's own machinery
(acks, heartbeats, the ledger) keeps trying Redis as it always has.
"""

from __future__ import annotations

import logging
import threading
import time

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger(__name__)

QUIET_S = 2.0
# What says "Redis did not answer": not a script error or a wrong type.
UNREACHABLE = (RedisConnectionError, RedisTimeoutError)

_lock = threading.Lock()
_failed_at = 0.0


def note_unreachable(exc: BaseException | None = None) -> None:
    """Redis did not answer: later callers in this process skip it for ``QUIET_S``."""
    global _failed_at
    with _lock:
        _failed_at = time.monotonic()


def recently_unreachable() -> bool:
    return _failed_at != 0.0 and time.monotonic() - _failed_at < QUIET_S


def reset() -> None:
    """Forget the last failure (tests; a process that knows Redis is back)."""
    global _failed_at
    with _lock:
        _failed_at = 0.0
