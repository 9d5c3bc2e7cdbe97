"""Per-actor rate limits on Dramatiq's Redis-backed rate limiters.

    @dramatiq.actor(queue_name="emails")
    @rate_limited("welcome-email", limit=lambda: settings.WELCOME_EMAIL_RATE_PER_SECOND)
    def send_welcome_email(user_id: int) -> None: ...

At most ``limit`` runs start per ``window`` seconds, counted in Redis so every
worker process shares the budget (Dramatiq's ``WindowRateLimiter``). A job over
the limit is not failed: it raises ``RateLimited`` (a ``jobs.errors.Deferred``)
with a delay to the next window plus jitter. The Retries middleware puts it
back as the same attempt, so a long burst never uses up its retries, and the
ledger shows it "delayed" meanwhile.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from functools import wraps
from typing import ParamSpec, TypeVar

from django_redis import get_redis_connection
from dramatiq.rate_limits import WindowRateLimiter
from dramatiq.rate_limits.backends import RedisBackend

from jobs.conf import jobs_settings
from jobs.errors import Deferred

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


class RateLimited(Deferred):
    """Over the rate limit: run again after ``delay`` ms."""


def _delay_ms(window: int) -> int:
    # Windows are whole wall-clock seconds; spread the retries over the next
    # window so the deferred jobs do not all come back at its first millisecond.
    now_ms = int(time.time() * 1000)
    return window * 1000 - now_ms % 1000 + random.randint(0, 1000 * window)


def _defer(key: str, window: int) -> RateLimited:
    delay = _delay_ms(window)
    logger.debug("Rate limit %s reached; deferred by %d ms", key, delay)
    return RateLimited(f"rate limit {key!r} reached", delay=delay)


def rate_limited(
    key: str, *, limit: int | Callable[[], int], window: int = 1
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Allow ``limit`` runs per ``window`` seconds; ``limit`` may be read at each call."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            limiter = WindowRateLimiter(  # type: ignore[no-untyped-call]
                RedisBackend(client=get_redis_connection(jobs_settings.JOBS_CACHE)),
                f"ratelimit:actor:{key}",
                limit=limit() if callable(limit) else limit,
                window=window,
            )
            with limiter.acquire(raise_on_failure=False) as acquired:
                if not acquired:
                    raise _defer(key, window)
                return fn(*args, **kwargs)

        return wrapper

    return decorate
